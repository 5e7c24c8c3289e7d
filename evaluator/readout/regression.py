"""The regression detector in the read model: live from the store's history, in
replay from the file's requests (the same sums, so the same answer), and as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from evaluator.core.batch import ScoredRequests
from evaluator.core.finalise import Attributed
from evaluator.core.maturity import Curves, curve, maturity_increments, partial_ndcg
from evaluator.core.provisional import MATURITY, PROVISIONAL, as_provisional, score_rows
from evaluator.core.regression import (
    Detection,
    HistoryKey,
    RegressionRules,
    coded_increments,
    detect,
)
from evaluator.core.scoring import ScoringConfig, score_sparse
from evaluator.core.timeutil import format_duration_ms, format_instant_ms
from evaluator.engine.ports import FloatArray, StateStore

Detections = Mapping[tuple[str, int], Detection]


@dataclass(frozen=True, slots=True)
class Early:
    """What replay scores requests with at the provisional age: the join's attributed
    interactions, the scoring, and the delays after the impression of the final and
    the provisional scoring."""

    attributed: Attributed
    scoring: ScoringConfig
    delay_ms: int
    key_ms: int
    """Provisional arrays are slotted this long after the impression."""


def live_detections(
    store: StateStore,
    rules: RegressionRules,
    frontier_ms: int,
    zero_relevance: str,
    variants: set[str],
) -> tuple[dict[tuple[str, int], Detection], Curves]:
    """The detector at the readout time, over the store's history, and the maturity
    curves, for ``variants`` (the windows' capped list: labels stay bounded)."""
    history = store.history(frontier_ms - rules.history_ms)
    mine = {
        key: a for key, a in history.items() if key[1].lstrip(PROVISIONAL + MATURITY) in variants
    }
    found = detect(rules, mine, frontier_ms, zero_relevance)
    return found, curve(mine, frontier_ms - rules.span_ms, rules.ks)


def file_history(
    scored: ScoredRequests, early: Early, rules: RegressionRules
) -> dict[HistoryKey, FloatArray]:
    """The history the engine would store for a file's requests: final arrays by
    deadline and, when provisional scoring is on, provisional ones by the time the
    engine scores them early, with the interactions of their first ``rules.age_ms``."""
    events = scored.requests.events
    n = len(events)
    request_ms = np.asarray(scored.requests.timestamp_ms, dtype=np.int64)
    variants = (scored.variant_names, scored.variant)
    final = score_rows(scored.scores, rules.ks)  # the statistics rows' columns it sums
    history = coded_increments(rules, request_ms + early.delay_ms, variants, final)
    if rules.lead_slots and n:
        seen = early.attributed.within(request_ms, rules.age_ms)
        partial = score_sparse(n, *seen[:3], early.scoring, metrics=("ndcg",))
        at = request_ms + early.key_ms
        rows = score_rows(partial, rules.ks)
        history |= as_provisional(coded_increments(rules, at, variants, rows))
    if rules.maturity_ages_ms and n:
        ndcg, ages = scored.scores.values["ndcg"], rules.maturity_ages_ms
        aged = partial_ndcg(early.attributed, request_ms, ndcg, ages, early.scoring)
        ends = (ndcg, scored.scores.engaged)
        history |= maturity_increments(request_ms + early.delay_ms, variants, ends, aged)
    return history


def file_detections(
    scored: ScoredRequests, early: Early, rules: RegressionRules, zero_relevance: str
) -> tuple[dict[tuple[str, int], Detection], Curves, int | None]:
    """The detector and the maturity curves at the end of a file (every request final;
    its last slot is complete), and that time."""
    if not scored.requests.events:
        return {}, {}, None
    history = file_history(scored, early, rules)
    last = max(scored.requests.timestamp_ms) + early.delay_ms
    end = (last // rules.slot_ms + 1) * rules.slot_ms
    return (
        detect(rules, history, end, zero_relevance),
        curve(history, end - rules.span_ms, rules.ks),
        end,
    )


def curves_json(curves: Curves, ages_ms: tuple[int, ...]) -> dict[str, Any]:
    """Per variant and K, the share of the final nDCG that each age gives (replay's
    ``regression.maturity``)."""
    out: dict[str, Any] = {}
    for (variant, k), shares in sorted(curves.items()):
        ages = map(format_duration_ms, ages_ms)
        out.setdefault(variant, {})[str(k)] = {
            a: round(float(v), 6) for a, v in zip(ages, shares, strict=True)
        }
    return out


def regression_json(found: Detections, at_ms: int | None) -> dict[str, Any]:
    """Per variant and K, the detector's state (replay's ``regression`` block)."""
    out: dict[str, Any] = {"at": format_instant_ms(at_ms) if at_ms is not None else None}
    variants: dict[str, Any] = {}
    for (variant, k), d in sorted(found.items()):
        variants.setdefault(variant, {})[str(k)] = {
            "armed": d.armed,
            "regression": d.regression,
            "score": round(d.score, 6),
            "since": format_instant_ms(d.since_ms) if d.since_ms is not None else None,
            "slot_ndcg": d.current,
            "baseline_ndcg": d.baseline,
            "provisional_ndcg": d.provisional,
            "provisional_band": d.band,
            "maturity": d.maturity,
            "partial_ndcg": d.partial,
        }
    out["variants"] = variants
    return out
