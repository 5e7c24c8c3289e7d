"""Batch evaluation of impression and interaction events: the engine behind ``evaluator replay``.

Pure: it takes decoded batches and settings and returns a :class:`ReplayResult`.
It uses the same join rules, relevance grading, scoring and aggregation as the
live pipeline; the only thing it lacks is processing time, so nothing is late.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from evaluator.aggregate import Moments, group_moments
from evaluator.cohort import COLD_START, ESTABLISHED, cohort_codes, earlier_counts
from evaluator.config import Settings
from evaluator.events import Impression, ImpressionBatch, InteractionColumns
from evaluator.join import (
    JoinRules,
    UserImpressions,
    count_outcomes,
    join_by_request_batch,
    join_by_user_batch,
    user_order,
)
from evaluator.propensity_estimation import (
    Estimate,
    Observation,
    clicked_positions,
    counter_day,
    estimate_all,
    first_kept_day,
    increments,
)
from evaluator.scoring import RequestScores, score_sparse

I64 = npt.NDArray[np.int64]


@dataclass(slots=True)
class Requests:
    """Deduplicated impressions as columns; row r is request r."""

    events: list[Impression] = field(default_factory=list)
    timestamp_ms: list[int] = field(default_factory=list)
    by_request: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0


def dedupe_impressions(batch: ImpressionBatch) -> Requests:
    """Keep the first impression per ``request_id`` (the rule the partition engine
    applies live: a redelivered impression repeats its request id)."""
    out = Requests()
    by_request = out.by_request
    for event, ts in zip(batch.events, batch.timestamp_ms, strict=True):
        if event.request_id in by_request:
            out.duplicates += 1
            continue
        by_request[event.request_id] = len(out.events)
        out.events.append(event)
        out.timestamp_ms.append(ts)
    return out


@dataclass(slots=True)
class Attribution:
    """Attributed grades as parallel columns, and what happened to every interaction."""

    row: list[int] = field(default_factory=list)
    position: list[int] = field(default_factory=list)
    grade: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    relevant_user: list[str] = field(default_factory=list)
    relevant_ms: list[int] = field(default_factory=list)
    """Every valid, first-seen interaction with grade > 0 (the cold-start history)."""


def attribute(
    requests: Requests, interactions: InteractionColumns, settings: Settings
) -> Attribution:
    """Apply the join rules to every interaction, ignoring repeated event ids.

    Interactions naming a request and the others each go through one batch join
    (the same functions live finalisation calls)."""
    rules = settings.join.rules()
    result = Attribution()
    seen: set[str] = set()
    mark = seen.add
    fresh = [i for i, e in enumerate(interactions.event_id) if not (e in seen or mark(e))]
    result.duplicates = len(interactions) - len(fresh)
    grade, users, times = interactions.grade, interactions.user_id, interactions.timestamp_ms
    relevant = [i for i in fresh if grade[i] > 0]
    result.relevant_user = [users[i] for i in relevant]
    result.relevant_ms = [times[i] for i in relevant]
    named = interactions.request_id
    for join, picked in (
        (_join_named, [i for i in fresh if named[i]]),
        (_join_loose, [i for i in fresh if not named[i]]),
    ):
        if picked:
            codes, rows, positions = join(requests, interactions, picked, rules)
            _record(result, [grade[i] for i in picked], codes, rows, positions)
    return result


JoinResult = tuple[npt.NDArray[np.int8], I64, I64]
"""Per interaction: outcome code, request row (valid where attributed), item position."""


def _record(
    result: Attribution, grades: list[float], codes: npt.NDArray[np.int8], rows: I64, positions: I64
) -> None:
    """Count the outcomes and keep the attributed (row, position, grade) entries."""
    count_outcomes(codes, result.outcomes)
    ok = np.flatnonzero(codes == 0)
    result.row += rows[ok].tolist()
    result.position += positions[ok].tolist()
    result.grade += [grades[j] for j in ok.tolist()]


def _join_named(
    requests: Requests, interactions: InteractionColumns, picked: list[int], rules: JoinRules
) -> JoinResult:
    """Interactions with a request id, all at once."""
    by_request = requests.by_request
    named, items = interactions.request_id, interactions.item_id
    rows = [by_request.get(named[i], -1) for i in picked]
    times = np.fromiter(
        (interactions.timestamp_ms[i] for i in picked), dtype=np.int64, count=len(picked)
    )
    codes, positions = join_by_request_batch(
        [items[i] for i in picked],
        times,
        rows,
        np.asarray(requests.timestamp_ms, dtype=np.int64),
        [e.items for e in requests.events],
        rules=rules,
    )
    return codes, np.asarray(rows, dtype=np.int64), positions


def _join_loose(
    requests: Requests, interactions: InteractionColumns, picked: list[int], rules: JoinRules
) -> JoinResult:
    """Interactions without a request id: the user's latest impression with the item."""
    events = requests.events
    index: dict[str, int] = {}
    imp_user = _first_seen_codes([e.user_id for e in events], index)
    imp_ms = np.asarray(requests.timestamp_ms, dtype=np.int64)
    order = user_order(imp_user, imp_ms, [e.request_id for e in events])
    users, times = interactions.user_id, interactions.timestamp_ms
    codes, chosen, positions = join_by_user_batch(
        [interactions.item_id[i] for i in picked],
        np.fromiter((times[i] for i in picked), dtype=np.int64, count=len(picked)),
        np.fromiter((index.get(users[i], -1) for i in picked), dtype=np.int64, count=len(picked)),
        UserImpressions(imp_user[order], imp_ms[order], [events[r].items for r in order.tolist()]),
        rules=rules,
    )
    rows = order[np.maximum(chosen, 0)] if order.size else np.full(len(picked), -1, np.int64)
    return codes, rows, positions


def _first_seen_codes(values: list[str], index: dict[str, int]) -> I64:
    """An integer code per string (any consistent numbering; ``index`` keeps it)."""
    return np.fromiter(
        map(index.setdefault, values, itertools.count(len(index))),
        dtype=np.int64,
        count=len(values),
    )


def _codes(values: list[str]) -> tuple[list[str], I64]:
    """Integer codes of strings, numbered in sorted order of the distinct values."""
    vocabulary = sorted(set(values))
    index = {v: i for i, v in enumerate(vocabulary)}
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    return vocabulary, codes


@dataclass(slots=True)
class ScoredRequests:
    """Everything known about each finalised request, as columns."""

    requests: Requests
    scores: RequestScores
    variant_names: list[str]
    variant: I64
    cohort: I64


def observations(requests: Requests, attribution: Attribution) -> list[Observation]:
    """Each request as the propensity estimators see it (its clicked positions)."""
    clicked = clicked_positions(
        len(requests.events), attribution.row, attribution.position, attribution.grade
    )
    return [
        Observation(e.context or "", e.items, c, e.randomization.key() if e.randomization else None)
        for e, c in zip(requests.events, clicked, strict=True)
    ]


def estimate_propensities(
    requests: Requests, attribution: Attribution, settings: Settings
) -> dict[str, Estimate]:
    """Every estimator's curve from the same counters the live store sums: the requests
    finalised in the newest ``propensity.history`` days of the file."""
    p = settings.propensity
    config = settings.finalise_config()
    days = [counter_day(config.deadline(ts)) for ts in requests.timestamp_ms]
    oldest = first_kept_day(max(days), p.history_ms()) if days else 0
    kept = [
        obs
        for obs, day in zip(observations(requests, attribution), days, strict=True)
        if day >= oldest
    ]
    counts = increments(kept, p.positions)
    return estimate_all(counts, p.positions, p.min_clicks)


VariantCodes = tuple[list[str], I64]
"""Variant names in sorted order, and each request's index into them."""


def variant_codes(requests: Requests) -> VariantCodes:
    return _codes([e.variant for e in requests.events])


def cohorts(requests: Requests, relevant_user: list[str], relevant_ms: list[int], cap: int) -> I64:
    """Cohort code of each request from its user's relevant interactions before it."""
    n = len(requests.events)
    codes = _first_seen_codes([e.user_id for e in requests.events] + relevant_user, {})
    request_ms = np.asarray(requests.timestamp_ms, dtype=np.int64)
    history_ms = np.asarray(relevant_ms, dtype=np.int64)
    earlier = earlier_counts(codes[n:], history_ms, codes[:n], request_ms, cap)
    return cohort_codes(earlier, cap)


def score(
    requests: Requests,
    attribution: Attribution,
    settings: Settings,
    *,
    curve: tuple[float, ...] | None = None,
    variants: VariantCodes | None = None,
) -> ScoredRequests:
    """Finalise every request: grades, scores, variant and cohort.

    ``curve`` is the propensity curve when the model is ``estimated``."""
    events = requests.events
    n = len(events)
    scores = score_sparse(
        n,
        np.asarray(attribution.row, dtype=np.int64),
        np.asarray(attribution.position, dtype=np.int64),
        np.asarray(attribution.grade, dtype=np.float64),
        settings.scoring(curve),
    )
    variant_names, variant = variants or variant_codes(requests)
    cap = settings.cold_start.min_relevant_history
    cohort = cohorts(requests, attribution.relevant_user, attribution.relevant_ms, cap)
    return ScoredRequests(requests, scores, variant_names, variant, cohort)


def moments_by_variant_cohort(scored: ScoredRequests) -> tuple[Moments, Moments]:
    """Moments per variant (all cohorts) and per (variant, cohort) with group v*3+cohort."""
    n_var = len(scored.variant_names)
    overall = group_moments(scored.variant, n_var, scored.scores)
    by_cohort = group_moments(scored.variant * 3 + scored.cohort, n_var * 3, scored.scores)
    return overall, by_cohort


__all__ = [
    "COLD_START",
    "ESTABLISHED",
    "Attribution",
    "Requests",
    "ScoredRequests",
    "attribute",
    "cohorts",
    "dedupe_impressions",
    "estimate_propensities",
    "moments_by_variant_cohort",
    "score",
    "variant_codes",
]
