"""Reports of evaluated requests: the JSON contract of ``evaluator replay`` and a readable table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.readout import ExperimentReadout
from evaluator.core.batch import ScoredRequests, VariantCodes, rows_by_variant_cohort
from evaluator.core.events import Damage, Impression
from evaluator.core.metrics.registry import METRICS, REGISTRY
from evaluator.core.metrics.setlevel import (
    coverage,
    distinct_by_cutoff,
    encode_top,
    intra_list_diversity,
)
from evaluator.core.rows import RowSchema, fresh_columns
from evaluator.core.sketch import hash_strings
from evaluator.core.windows import hash_buckets
from evaluator.readout.ab_report import ab_json, ab_lines
from evaluator.readout.config import ReadoutConfig
from evaluator.readout.model import (
    NAN,
    WITH_STDERR,
    GroupView,
    ReadModel,
    VariantView,
    WindowView,
    composite_of,
    finite,
    group_view,
)

COHORT_NAMES = {1: "cold_start", 2: "established"}


@dataclass(slots=True)
class EventCounts:
    """Input-side counters reported beside the metrics."""

    impressions: int = 0
    interactions: int = 0
    invalid_by_reason: Counter[str] = field(default_factory=Counter)
    invalid_samples: list[dict[str, Any]] = field(default_factory=list)
    damaged: list[Damage] = field(default_factory=list)
    """Compressed inputs that stopped being readable (their lines before were read)."""


def set_level(
    events: Sequence[Impression], variants: VariantCodes, config: ReadoutConfig
) -> dict[str, dict[str, Any]]:
    """Coverage@K and intra-list diversity@K per variant (of the deduplicated requests)."""
    variant_names, variant = variants
    lists = [e.items for e in events]
    ks = config.ks
    per_variant = [
        [lists[r] for r in np.flatnonzero(variant == code).tolist()]
        for code in range(len(variant_names))
    ]
    distinct = [distinct_by_cutoff(mine, ks) for mine in per_variant]
    full_sets = [full for _, full in distinct]
    catalog = config.catalog_size or len(set().union(*full_sets))
    attribute = config.diversity_attribute
    attrs = None
    if any(e.item_attributes for e in events):
        attrs = encode_top([(e.item_attributes or {}).get(attribute, []) for e in events], max(ks))
    out: dict[str, dict[str, Any]] = {}
    for code, name in enumerate(variant_names):
        rows = np.flatnonzero(variant == code)
        cov = {str(k): coverage(distinct[code][0][k], catalog) for k in ks}
        div: dict[str, float | None] = dict.fromkeys(map(str, ks))
        for k in ks if attrs is not None else ():
            ild = intra_list_diversity(attrs[rows, :k])  # type: ignore[index]
            if np.isfinite(ild).any():
                div[str(k)] = float(np.nanmean(ild))
        out[name] = {"coverage": cov, "diversity": div, "catalog_size": catalog}
    return out


def read_file(
    scored: ScoredRequests,
    config: ReadoutConfig,
    setlevel: dict[str, dict[str, Any]],
    experiments: list[ExperimentReadout],
) -> ReadModel:
    """The read model of a whole file: one window (``file``) over every request, and
    the experiments read over it (``setlevel``: :func:`set_level`'s result)."""
    ks, policy = config.ks, config.zero_relevance
    schema = RowSchema(fresh_columns(ks, METRICS))  # the rows replay sums
    hashes = hash_strings([e.user_id for e in scored.requests.events])
    bucket = hash_buckets(hashes, config.layout)
    distinct = distinct_users(hashes, scored.variant, len(scored.variant_names))
    overall, by_cohort = rows_by_variant_cohort(scored, bucket, config.layout.user_buckets)
    views = []
    catalog = 0
    for code, name in enumerate(scored.variant_names):
        cohorts = {"all": group_view(overall[code], schema, ks, policy)}
        for cohort, label in COHORT_NAMES.items():
            cohorts[label] = group_view(by_cohort[code * 3 + cohort], schema, ks, policy)
        sets = setlevel[name]
        coverage = {k: float(sets["coverage"][str(k)]) for k in ks}
        diversity = {k: _nan(sets["diversity"][str(k)]) for k in ks}
        catalog = sets["catalog_size"]
        score = composite_of(cohorts["all"], coverage, diversity, config.composite)
        views.append(
            VariantView(name, cohorts, coverage, diversity, score, users=int(distinct[code]))
        )
    return ReadModel(windows=[WindowView("file", views, catalog=catalog)], experiments=experiments)


def distinct_users(
    hashes: npt.NDArray[np.uint64], variant: npt.NDArray[np.int64], variants: int
) -> npt.NDArray[np.int64]:
    """Per variant code, how many distinct users its requests have, by the users' 64-bit
    stable hashes (exact but for a collision: odds about n²/2⁶⁵, 3e-8 at a million)."""
    out = np.zeros(variants, dtype=np.int64)
    for code in range(variants):
        out[code] = np.unique(hashes[variant == code]).size
    return out


def _nan(value: float | None) -> float:
    return NAN if value is None else float(value)


def _group_json(group: GroupView, ks: tuple[int, ...]) -> dict[str, Any]:
    """Counts and means of one group (read as the exporter reads a window's)."""
    requests, engaged = int(group.requests), int(group.engaged)
    block: dict[str, Any] = {"requests": requests, "engaged": engaged}
    block["unengaged"] = requests - engaged
    for metric in METRICS:
        block[metric] = {str(k): finite(group.means[(metric, k)]) for k in ks}
    block["stderr"] = {
        metric: {str(k): finite(group.stderr[(metric, k)]) for k in ks}
        for metric in WITH_STDERR
        if all((metric, k) in group.stderr for k in ks)
    }
    return block


def _variant_json(view: VariantView, ks: tuple[int, ...], catalog: int) -> dict[str, Any]:
    block = _group_json(view.cohorts["all"], ks)
    block["coverage"] = {str(k): view.coverage[k] for k in ks}
    block["diversity"] = {str(k): finite(view.diversity[k]) for k in ks}
    block["catalog_size"] = catalog
    block["users"] = int(view.users)
    block["composite"] = finite(view.composite)
    block["cohorts"] = {
        label: _group_json(view.cohorts[label], ks) for label in COHORT_NAMES.values()
    }
    return block


def build_report(
    model: ReadModel,
    outcomes: Counter[str],
    duplicates: int,
    counts: EventCounts,
    config: ReadoutConfig,
) -> dict[str, Any]:
    """The replay report of :func:`read_file`'s model; its keys are a contract other
    tools read (README.md, "Evaluating your own event files"; docs/semantics.md for
    each metric)."""
    (window,) = model.windows
    variants = {v.variant: _variant_json(v, config.ks, window.catalog) for v in window.variants}
    unmatched = {k: v for k, v in outcomes.items() if k != "attributed"}
    return {
        "variants": variants,
        "events": {
            "impressions": counts.impressions,
            "interactions": counts.interactions,
            "invalid": sum(counts.invalid_by_reason.values()),
            "invalid_by_reason": dict(sorted(counts.invalid_by_reason.items())),
            "attributed": outcomes.get("attributed", 0),
            "unmatched": sum(unmatched.values()),
            "unmatched_by_reason": dict(sorted(unmatched.items())),
            "duplicates": duplicates,
            "late": 0,
            "incomplete": [d.describe() for d in counts.damaged],
        },
        "invalid_lines": counts.invalid_samples,
        "settings": dict(config.described),
        "ab": ab_json(model.experiments),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def render_table(report: dict[str, Any]) -> str:
    """A readable summary: one row per variant and cohort, then the event counters."""
    ks = report["settings"]["k"]
    header = ["variant", "cohort", "requests", "engaged"]
    shown = [m for m in REGISTRY if m.table]
    for k in ks:
        header += [f"{m.label}@{k}" for m in shown]
    header += ["cov@" + str(ks[0]), "div@" + str(ks[0]), "composite"]
    rows: list[list[str]] = [header]
    for name, block in report["variants"].items():
        for cohort, sub in [("all", block), *block["cohorts"].items()]:
            row = [name, cohort, _fmt(sub["requests"]), _fmt(sub["engaged"])]
            for k in ks:
                key = str(k)
                row += [_fmt(sub[m.name][key]) for m in shown]
            if cohort == "all":
                first = str(ks[0])
                row += [_fmt(block["coverage"][first]), _fmt(block["diversity"][first])]
                row += [_fmt(block["composite"])]
            else:
                row += ["", "", ""]
            rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            c.rjust(w) if j > 1 else c.ljust(w)
            for j, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    ev = report["events"]
    lines.append("")
    lines.append(
        f"events: {ev['impressions']} impressions, {ev['interactions']} interactions, "
        f"{ev['attributed']} attributed, {ev['unmatched']} unmatched, "
        f"{ev['duplicates']} duplicates, {ev['invalid']} invalid"
    )
    for title, key in (("unmatched", "unmatched_by_reason"), ("invalid", "invalid_by_reason")):
        if ev[key]:
            lines.append(f"  {title}: " + ", ".join(f"{r}={n}" for r, n in ev[key].items()))
    if report.get("ab"):
        lines += ["", *ab_lines(report["ab"], ks[0])]
    if report.get("regression"):
        lines += ["", *regression_lines(report["regression"])]
    return "\n".join(lines)


def regression_lines(block: dict[str, Any]) -> list[str]:
    """The regression detector at the file's end, a line per variant and K."""
    if block.get("reason"):
        return [f"regression: not read ({block['reason']})"]
    lines = [f"regression (at {block['at']}):"]
    for variant, by_k in block["variants"].items():
        for k, d in by_k.items():
            if not d["armed"]:
                state = "not armed (less than a week of history)"
            elif d["regression"]:
                state = f"IN REGRESSION since {d['since']} (score {d['score']:.2f})"
            else:
                state = f"ok (score {d['score']:.2f})"
            lines.append(f"  {variant} nDCG@{k}: {state}")
    for variant, by_k in block.get("maturity", {}).items():
        k, shares = next(iter(by_k.items()))
        curve = ", ".join(f"{age} {share:.2f}" for age, share in shares.items())
        lines.append(f"  {variant} nDCG@{k} maturity (share of the final by age): {curve}")
    return lines
