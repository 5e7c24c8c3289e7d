"""Batch evaluation of impression and interaction events: the engine behind ``evaluator replay``.

Pure: it takes decoded batches and settings and returns a :class:`ReplayResult`.
It uses the same join rules, relevance grading, scoring and aggregation as the
live pipeline; the only thing it lacks is processing time, so nothing is late.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.interleaving import Credited, credit, draft
from evaluator.core.aggregate import group_rows
from evaluator.core.cohort import COLD_START, ESTABLISHED
from evaluator.core.events import Impression, ImpressionBatch, InteractionColumns
from evaluator.core.finalise import (
    Attributed,
    History,
    LooseInteractions,
    NamedInteractions,
    attribute_loose,
    attribute_named,
)
from evaluator.core.finalise import cohorts as finalise_cohorts
from evaluator.core.finalise import observations as finalise_observations
from evaluator.core.join import JoinRules, UserImpressions, user_order
from evaluator.core.propensity.estimation import (
    Estimate,
    Observation,
    counter_day,
    estimate_all,
    first_kept_day,
    increments,
)
from evaluator.core.scoring import RequestScores, ScoringConfig, score_sparse
from evaluator.core.windows import contribution_rows

I64 = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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
    """Attributed grades as columns, and what happened to every interaction."""

    attributed: Attributed = field(default_factory=lambda: Attributed.join([]))
    outcomes: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    relevant_user: list[str] = field(default_factory=list)
    relevant_ms: list[int] = field(default_factory=list)
    """Every valid, first-seen interaction with grade > 0 (the cold-start history)."""


def attribute(
    requests: Requests, interactions: InteractionColumns, rules: JoinRules
) -> Attribution:
    """Apply the join rules to every interaction, ignoring repeated event ids.

    Interactions naming a request and the others each go through one batch join:
    the functions live finalisation calls, with every request of the files due."""
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
    request_ms = np.asarray(requests.timestamp_ms, dtype=np.int64)
    by_request = requests.by_request
    picked = [i for i in fresh if named[i]]
    parts = [
        attribute_named(
            request_ms,
            [e.items for e in requests.events],
            NamedInteractions(
                [by_request.get(named[i], -1) for i in picked],
                *_columns(interactions, picked),
            ),
            rules,
            result.outcomes,
        )
    ]
    picked = [i for i in fresh if not named[i]]
    if picked:
        parts.append(
            _join_loose(
                requests, request_ms, interactions, picked, rules=rules, outcomes=result.outcomes
            )
        )
    result.attributed = Attributed.join(parts)
    return result


def _columns(
    interactions: InteractionColumns, picked: list[int]
) -> tuple[list[str], I64, npt.NDArray[np.float64]]:
    """Item ids, times and grades of the picked interactions."""
    times, grades = interactions.timestamp_ms, interactions.grade
    n = len(picked)
    return (
        [interactions.item_id[i] for i in picked],
        np.fromiter((times[i] for i in picked), dtype=np.int64, count=n),
        np.fromiter((grades[i] for i in picked), dtype=np.float64, count=n),
    )


def _join_loose(
    requests: Requests,
    request_ms: I64,
    interactions: InteractionColumns,
    picked: list[int],
    *,
    rules: JoinRules,
    outcomes: Counter[str],
) -> Attributed:
    """Interactions without a request id: the user's latest impression with the item."""
    events = requests.events
    index: dict[str, int] = {}
    imp_user = _first_seen_codes([e.user_id for e in events], index)
    order = user_order(imp_user, request_ms, [e.request_id for e in events])
    users = interactions.user_id
    return attribute_loose(
        UserImpressions(imp_user[order], request_ms[order], [events[r].items for r in order]),
        order,
        LooseInteractions(
            np.fromiter((index.get(users[i], -1) for i in picked), np.int64, len(picked)),
            *_columns(interactions, picked),
        ),
        rules,
        outcomes,
        classify=True,
    )[0]


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
    interleaving: Credited | None = None
    """Interleaved requests' ranker pairs and outcomes (None: none was interleaved)."""


def observations(requests: Requests, attribution: Attribution) -> list[Observation]:
    """Each request as the propensity estimators see it (its clicked positions)."""
    events = requests.events
    return finalise_observations(
        [e.context or "" for e in events],
        [e.items for e in events],
        [e.randomization.key() if e.randomization else None for e in events],
        attribution.attributed,
    )


@dataclass(frozen=True, slots=True)
class EstimationConfig:
    """What the propensity estimators take, as plain values."""

    deadline: Callable[[int], int]
    """A request's finalisation time from its impression time (the day it is counted in)."""
    history_ms: int
    positions: int
    min_clicks: int


def estimate_propensities(
    requests: Requests, attribution: Attribution, config: EstimationConfig
) -> dict[str, Estimate]:
    """Every estimator's curve from the same counters the live store sums: the requests
    finalised in the newest ``history_ms`` (whole days) of the file."""
    days = [counter_day(config.deadline(ts)) for ts in requests.timestamp_ms]
    oldest = first_kept_day(max(days), config.history_ms) if days else 0
    kept = [
        obs
        for obs, day in zip(observations(requests, attribution), days, strict=True)
        if day >= oldest
    ]
    counts = increments(kept, config.positions)
    return estimate_all(counts, config.positions, config.min_clicks)


VariantCodes = tuple[list[str], I64]
"""Variant names in sorted order, and each request's index into them."""


def variant_codes(requests: Requests) -> VariantCodes:
    return _codes([e.variant for e in requests.events])


def cohorts(requests: Requests, relevant_user: list[str], relevant_ms: list[int], cap: int) -> I64:
    """Cohort code of each request from its user's relevant interactions before it."""
    codes: dict[str, int] = {}
    history = History(
        codes,
        _first_seen_codes(relevant_user, codes),
        np.asarray(relevant_ms, dtype=np.int64),
    )
    request_ms = np.asarray(requests.timestamp_ms, dtype=np.int64)
    return finalise_cohorts([e.user_id for e in requests.events], request_ms, history, cap)


def score(
    requests: Requests,
    attribution: Attribution,
    scoring: ScoringConfig,
    min_relevant_history: int,
    *,
    variants: VariantCodes | None = None,
) -> ScoredRequests:
    """Finalise every request: grades, scores (under ``scoring``, with the propensity
    curve it carries), variant and cohort."""
    events = requests.events
    n = len(events)
    scores = score_sparse(n, *attribution.attributed[:3], scoring)
    variant_names, variant = variants or variant_codes(requests)
    cap = min_relevant_history
    cohort = cohorts(requests, attribution.relevant_user, attribution.relevant_ms, cap)
    interleaved = [i for i, e in enumerate(events) if e.teams is not None]
    credited = None
    if interleaved:
        drafts = [""] * n
        for i in interleaved:
            drafts[i] = draft(events[i].teams or [], events[i].interleaving or {})
        credited = credit(drafts, *attribution.attributed[:3])
    return ScoredRequests(requests, scores, variant_names, variant, cohort, credited)


def rows_by_variant_cohort(
    scored: ScoredRequests, bucket: I64, buckets: int
) -> tuple[FloatArray, FloatArray]:
    """Statistics rows summed per variant (all cohorts) and per (variant, cohort) with
    group v*3+cohort, each per user bucket (``bucket`` of each request, of ``buckets``;
    the unit of the means' standard errors): the sums live window buckets hold
    (diversity and overlap are left out: replay reports set-level metrics of its own).
    Shapes (groups, buckets, columns)."""
    n_var, n = len(scored.variant_names), len(scored.variant)
    scores = scored.scores
    rows = contribution_rows(scores, np.full((n, len(scores.ks)), np.nan), np.full(n, np.nan))
    overall = group_rows(scored.variant * buckets + bucket, n_var * buckets, rows)
    cohort = (scored.variant * 3 + scored.cohort) * buckets + bucket
    by_cohort = group_rows(cohort, n_var * 3 * buckets, rows)
    width = rows.shape[1]
    return overall.reshape(n_var, buckets, width), by_cohort.reshape(n_var * 3, buckets, width)


__all__ = [
    "COLD_START",
    "ESTABLISHED",
    "Attribution",
    "EstimationConfig",
    "Requests",
    "ScoredRequests",
    "attribute",
    "cohorts",
    "dedupe_impressions",
    "estimate_propensities",
    "rows_by_variant_cohort",
    "score",
    "variant_codes",
]
