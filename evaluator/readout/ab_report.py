"""Replay's A/B readout: the experiments of a file, read by the exporter's code.

Replay finalises every request of the files at once, so each experiment's
cumulative statistics are all of its requests, and its users are counted at
their first impression in the file (a user's events keep their order, as in a
partition). The readout itself is :func:`evaluator.core.ab.readout.read_experiment`, the
function behind the Prometheus series and the dashboard. Pure: no I/O.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any

import numpy as np

from evaluator.core.ab.cuped import pre_exposure_counts
from evaluator.core.ab.interleaving import add_outcomes
from evaluator.core.ab.readout import Comparison, ExperimentReadout, PairReadout, read_experiment
from evaluator.core.ab.stats import SequentialTracker
from evaluator.core.batch import ScoredRequests
from evaluator.core.rows import COVARIATE, INTERLEAVING
from evaluator.core.windows import contribution_rows, user_buckets
from evaluator.readout.config import ReadoutConfig


def _first_exposures(users: list[str], rows: list[int]) -> list[int]:
    """Each user's first request among ``rows`` (file order): their exposure."""
    seen: dict[str, int] = {}
    for i in rows:
        seen.setdefault(users[i], i)
    return list(seen.values())


def _covariates(
    blocks: dict[str, Any],
    first: list[int],
    context: tuple[list[str], list[str], Any, Any],
    relevant: tuple[list[str], list[int]],
    config: ReadoutConfig,
) -> None:
    """Add the exposed users' CUPED covariates to their variant's block, as the live
    engine adds them at each user's exposure (:mod:`evaluator.engine.activity`)."""
    users, variants, times, bucket = context
    days = config.ab.cuped_lookback_days
    if not days or not first:
        return
    x_col, users_col = (config.layout.schema.index(name) for name in COVARIATE)
    exposed = np.asarray(first, dtype=np.int64)
    counts = pre_exposure_counts(
        [users[i] for i in first], times[exposed], relevant[0], np.asarray(relevant[1]), days
    )
    for i, x in zip(first, counts.tolist(), strict=True):
        if x and variants[i] in blocks:
            block = blocks[variants[i]]
            block[0, bucket[i], x_col] += x
            block[0, bucket[i], users_col] += 1


def experiment_readouts(
    scored: ScoredRequests,
    config: ReadoutConfig,
    relevant: tuple[list[str], list[int]] = ([], []),
) -> list[ExperimentReadout]:
    """Each configured experiment (or ``default``) read once over the files;
    ``relevant``: every relevant interaction's user and time (CUPED's covariates)."""
    events = scored.requests.events
    users = [e.user_id for e in events]
    variants = [scored.variant_names[c] for c in scored.variant.tolist()]
    times = np.asarray(scored.requests.timestamp_ms, dtype=np.int64)
    layout = config.layout
    rules = config.rules()
    n = len(events)
    nan = np.full((n, len(layout.ks)), np.nan)
    rows = contribution_rows(scored.scores, nan, nan[:, 0], layout.schema)
    bucket = user_buckets(users, layout) if n else np.zeros(0, dtype=np.int64)
    out = []
    for experiment in config.experiments:
        mine = experiment.rows(variants, times)
        blocks: dict[str, Any] = {}
        for code in np.unique(scored.variant[mine]).tolist():
            picked = mine[scored.variant[mine] == code]
            block = np.zeros((1, layout.user_buckets, rows.shape[1]))
            np.add.at(block[0], bucket[picked], rows[picked])
            blocks[scored.variant_names[code]] = block
        if scored.interleaving is not None:
            _add_pairs(blocks, scored, mine, bucket, config)
        first = _first_exposures(users, mine.tolist())
        exposed: dict[str, int] = {}
        for i in first:
            exposed[variants[i]] = exposed.get(variants[i], 0) + 1
        _covariates(blocks, first, (users, variants, times, bucket), relevant, config)
        tracker = SequentialTracker()
        readout = read_experiment(experiment, blocks, exposed, rules, tracker)
        readout.overlap = _overlap(scored, mine, readout.control, layout.ks)
        out.append(readout)
    return out


def _add_pairs(
    blocks: dict[str, Any], scored: ScoredRequests, rows: Any, bucket: Any, config: ReadoutConfig
) -> None:
    """Add the interleaved requests among ``rows`` to their ranker pair's block, as the
    live engine adds them at finalisation."""
    assert scored.interleaving is not None
    layout = config.layout
    total, requests, wins = (layout.schema.index(name) for name in INTERLEAVING)

    def block_of(pair: str) -> Any:
        return blocks.setdefault(pair, np.zeros((1, layout.user_buckets, layout.row_width)))

    cohort = np.zeros(bucket.size, dtype=np.int64)
    add_outcomes(block_of, scored.interleaving, rows, (cohort, bucket), (total, requests, wins))


def _overlap(
    scored: ScoredRequests, rows: Any, control: str, ks: tuple[int, ...]
) -> dict[tuple[str, int], float]:
    """Jaccard@K of each variant's top-K item set with the control's, over ``rows``."""
    if not control:
        return {}
    events = scored.requests.events
    codes = scored.variant[rows]
    sets: dict[str, dict[int, set[str]]] = {}
    for code in np.unique(codes).tolist():
        lists = [events[r].items for r in rows[codes == code].tolist()]
        seen: set[str] = set()
        per_k: dict[int, set[str]] = {}
        done = 0
        for k in sorted(ks):  # each rank slice added once, as for coverage
            seen.update(chain.from_iterable(items[done:k] for items in lists))
            per_k[k], done = set(seen), k
        sets[scored.variant_names[code]] = per_k
    if control not in sets:
        return {}
    out = {}
    for variant, per_k in sets.items():
        if variant == control:
            continue
        for k in ks:
            union = per_k[k] | sets[control][k]
            out[(variant, k)] = len(per_k[k] & sets[control][k]) / len(union) if union else 0.0
    return out


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def ab_json(readouts: list[ExperimentReadout]) -> dict[str, Any]:
    """The report's ``"ab"`` block (docs/statistics.md, "Replay's readout")."""
    return {
        r.name: {
            "control": r.control,
            "users": r.users,
            "requests": r.requests,
            "srm_p_value": _num(r.srm_p_fixed),
            "srm_p_sequential": _num(r.srm_p_sequential),
            "overlap": {
                variant: {str(k): j for (v, k), j in r.overlap.items() if v == variant}
                for variant in sorted({v for v, _ in r.overlap})
            },
            "comparisons": [_comparison(c) for c in r.comparisons],
            "cuped": [{**_comparison(c), "variance_reduction": _num(c.reduction)} for c in r.cuped],
            "interleaving": [_pair(p) for p in r.interleaving],
        }
        for r in readouts
    }


def _pair(p: PairReadout) -> dict[str, Any]:
    return {
        "rankers": [p.first, p.second],
        "preference": _num(p.preference),
        "lower": _num(p.lower),
        "upper": _num(p.upper),
        "p_sequential": _num(p.p_sequential),
        "p_fixed": _num(p.p_fixed),
        "share_second": _num(p.share_second),
        "requests": p.requests,
        "ready": p.ready,
        "reason": p.reason,
    }


def _comparison(c: Comparison) -> dict[str, Any]:
    return {
        "variant": c.variant,
        "k": c.k,
        "adjusted": c.adjusted == "true",
        "diff": _num(c.diff),
        "lower": _num(c.lower),
        "upper": _num(c.upper),
        "p_sequential": _num(c.p_sequential),
        "p_holm": _num(c.p_holm),
        "p_fixed": _num(c.p_fixed),
        "ready": c.ready,
        "reason": c.reason,
    }


def _f(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    if value is not None and value < 1e-4:
        return "< 0.0001"
    return _f(value)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def ab_lines(ab: dict[str, Any], k: int) -> list[str]:
    """The A/B part of the readable table (raw nDCG@k)."""
    lines = []
    for name, block in ab.items():
        users = " / ".join(f"{v} {n:,}" for v, n in block["users"].items())
        lines.append(
            f"A/B {name} (control {block['control']}): users {users}, "
            f"SRM p {_p(block['srm_p_value'])} "
            f"(always valid {_p(block.get('srm_p_sequential'))})"
        )
        for c in block["comparisons"]:
            if c["k"] != k or c["adjusted"]:
                continue
            jaccard = block.get("overlap", {}).get(c["variant"], {}).get(str(k))
            overlap = "" if jaccard is None else f", item overlap (Jaccard@{k}) {jaccard:.3f}"
            if not c["ready"]:
                lines.append(
                    f"  {c['variant']}: nDCG@{k} diff {_f(c['diff'])} ({c['reason']}){overlap}"
                )
                continue
            lines.append(
                f"  {c['variant']}: nDCG@{k} diff {_f(c['diff'])} "
                f"[{_f(c['lower'])}, {_f(c['upper'])}], p sequential {_p(c['p_sequential'])}, "
                f"fixed {_p(c['p_fixed'])}{overlap}"
            )
            for a in block.get("cuped", []):
                if (a["variant"], a["k"], a["adjusted"]) == (c["variant"], k, False):
                    lines.append(
                        f"    CUPED: diff {_f(a['diff'])} [{_f(a['lower'])}, {_f(a['upper'])}], "
                        f"p sequential {_p(a['p_sequential'])}, "
                        f"{_share(a['variance_reduction'])} of the variance removed"
                    )
        for p in block.get("interleaving", []):
            first, second = p["rankers"]
            lines.append(
                f"  interleaving {first} vs {second}: preference for {second} "
                f"{_f(p['preference'])} [{_f(p['lower'])}, {_f(p['upper'])}], "
                f"p sequential {_p(p['p_sequential'])}, {second} won "
                f"{_share(p['share_second'])} of {p['requests']:,.0f} informative requests"
                + ("" if p["ready"] else f" ({p['reason']})")
            )
    return lines
