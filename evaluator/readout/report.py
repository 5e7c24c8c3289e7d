"""Reports of evaluated requests: the JSON contract of ``evaluator replay`` and a readable table."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluator.core.aggregate import FloatArray
from evaluator.core.batch import ScoredRequests, VariantCodes, rows_by_variant_cohort
from evaluator.core.events import Damage, Impression
from evaluator.core.metrics.composite import composite_score
from evaluator.core.metrics.registry import METRICS, REGISTRY
from evaluator.core.metrics.setlevel import (
    coverage,
    distinct_by_cutoff,
    encode_top,
    intra_list_diversity,
)
from evaluator.core.rows import RowSchema, fresh_columns
from evaluator.readout.ab_report import ab_lines
from evaluator.readout.config import ReadoutConfig

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


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _metric_block(
    row: FloatArray, schema: RowSchema, ks: tuple[int, ...], policy: str
) -> dict[str, Any]:
    """Counts and means of one group's summed statistics row (read as the exporter reads
    a window's)."""
    requests, engaged = int(row[0]), int(row[1])
    block: dict[str, Any] = {
        "requests": requests,
        "engaged": engaged,
        "unengaged": requests - engaged,
    }
    for metric in METRICS:
        block[metric] = {str(k): _finite(schema.mean(row, metric, k, policy)) for k in ks}
    return block


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


def _composite(block: dict[str, Any], weights: dict[str, float]) -> float | None:
    values: dict[str, float] = {}
    for name in weights:
        metric, _, k = name.partition("@")
        entry = block.get(metric)
        value = entry.get(k) if isinstance(entry, dict) else entry
        values[name] = float("nan") if value is None else float(value)
    return _finite(composite_score(values, weights))


def build_report(
    scored: ScoredRequests,
    outcomes: Counter[str],
    duplicates: int,
    counts: EventCounts,
    config: ReadoutConfig,
    *,
    setlevel: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The replay report; its keys are a contract other tools read (README.md,
    "Evaluating your own event files"; docs/semantics.md for each metric).

    ``setlevel`` is :func:`set_level`'s result when the caller computed it already."""
    ks = config.ks
    policy = config.zero_relevance
    schema = RowSchema(fresh_columns(ks, METRICS))  # the rows replay sums
    overall, by_cohort = rows_by_variant_cohort(scored)
    if setlevel is None:
        setlevel = set_level(scored.requests.events, (scored.variant_names, scored.variant), config)
    variants: dict[str, Any] = {}
    for code, name in enumerate(scored.variant_names):
        block = _metric_block(overall[code], schema, ks, policy)
        block.update(setlevel[name])
        block["composite"] = _composite(block, dict(config.composite))
        block["cohorts"] = {
            label: _metric_block(by_cohort[code * 3 + cohort], schema, ks, policy)
            for cohort, label in COHORT_NAMES.items()
        }
        variants[name] = block
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
    return "\n".join(lines)
