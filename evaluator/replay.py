"""Batch evaluation of impression and interaction events: the engine behind ``evaluator replay``.

Pure: it takes decoded batches and settings and returns a :class:`ReplayResult`.
It uses the same join rules, relevance grading, scoring and aggregation as the
live pipeline; the only thing it lacks is processing time, so nothing is late.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from evaluator.aggregate import Moments, group_moments
from evaluator.cohort import COLD_START, ESTABLISHED, cohort_codes, earlier_counts
from evaluator.config import Settings
from evaluator.events import ImpressionBatch, InteractionBatch
from evaluator.join import Candidate, JoinOutcome, join_by_request, join_by_user
from evaluator.scoring import RequestScores, score_sparse

I64 = npt.NDArray[np.int64]


@dataclass(slots=True)
class Requests:
    """Deduplicated impressions as columns; row r is request r."""

    batch: ImpressionBatch
    rows: list[int]
    """Index into ``batch`` of each kept impression."""
    by_request: dict[str, int]
    duplicates: int


def dedupe_impressions(batch: ImpressionBatch) -> Requests:
    """Keep the first impression per ``event_id`` and per ``request_id``."""
    seen_events: set[str] = set()
    by_request: dict[str, int] = {}
    rows: list[int] = []
    duplicates = 0
    for i, event in enumerate(batch.events):
        if event.event_id in seen_events or event.request_id in by_request:
            duplicates += 1
            continue
        seen_events.add(event.event_id)
        by_request[event.request_id] = len(rows)
        rows.append(i)
    return Requests(batch, rows, by_request, duplicates)


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


def _user_candidates(requests: Requests) -> dict[str, tuple[list[Candidate], list[int]]]:
    batch = requests.batch
    grouped: dict[str, list[tuple[int, str, int]]] = {}
    for row, i in enumerate(requests.rows):
        event = batch.events[i]
        grouped.setdefault(event.user_id, []).append((batch.timestamp_ms[i], event.request_id, row))
    out: dict[str, tuple[list[Candidate], list[int]]] = {}
    for user, entries in grouped.items():
        entries.sort()
        cands = [Candidate(ts, rid, batch.events[requests.rows[r]].items) for ts, rid, r in entries]
        out[user] = (cands, [r for _, _, r in entries])
    return out


def attribute(
    requests: Requests, interactions: InteractionBatch, settings: Settings
) -> Attribution:
    """Apply the join rules to every interaction, ignoring duplicate event ids."""
    rules = settings.join.rules()
    batch = requests.batch
    by_user = _user_candidates(requests)
    result = Attribution()
    seen: set[str] = set()
    for event, ts, grade in zip(
        interactions.events, interactions.timestamp_ms, interactions.grade, strict=True
    ):
        if event.event_id in seen:
            result.duplicates += 1
            continue
        seen.add(event.event_id)
        if grade > 0:
            result.relevant_user.append(event.user_id)
            result.relevant_ms.append(ts)
        if event.request_id:
            row = requests.by_request.get(event.request_id, -1)
            cand = None
            if row >= 0:
                i = requests.rows[row]
                cand = Candidate(batch.timestamp_ms[i], event.request_id, batch.events[i].items)
            outcome, pos = join_by_request(event.item_id, ts, cand, rules)
        else:
            cands, cand_rows = by_user.get(event.user_id, ([], []))
            outcome, idx, pos = join_by_user(event.item_id, ts, cands, rules)
            row = cand_rows[idx] if idx >= 0 else -1
        result.outcomes[outcome] += 1
        if outcome is JoinOutcome.ATTRIBUTED:
            result.row.append(row)
            result.position.append(pos)
            result.grade.append(grade)
    return result


def _codes(values: list[str]) -> tuple[list[str], I64]:
    if not values:
        return [], np.zeros(0, dtype=np.int64)
    uniques, inverse = np.unique(np.asarray(values, dtype=np.str_), return_inverse=True)
    return [str(u) for u in uniques], inverse.astype(np.int64)


@dataclass(slots=True)
class ScoredRequests:
    """Everything known about each finalised request, as columns."""

    requests: Requests
    scores: RequestScores
    variant_names: list[str]
    variant: I64
    cohort: I64


def score(requests: Requests, attribution: Attribution, settings: Settings) -> ScoredRequests:
    """Finalise every request: grades, scores, variant and cohort."""
    batch = requests.batch
    n = len(requests.rows)
    scores = score_sparse(
        n,
        np.asarray(attribution.row, dtype=np.int64),
        np.asarray(attribution.position, dtype=np.int64),
        np.asarray(attribution.grade, dtype=np.float64),
        settings.scoring(),
    )
    events = [batch.events[i] for i in requests.rows]
    variant_names, variant = _codes([e.variant for e in events])
    users = [e.user_id for e in events]
    _, codes = _codes(users + attribution.relevant_user)
    request_user, history_user = codes[:n], codes[n:]
    request_ms = np.asarray([batch.timestamp_ms[i] for i in requests.rows], dtype=np.int64)
    cap = settings.cold_start.min_relevant_history
    history_ms = np.asarray(attribution.relevant_ms, dtype=np.int64)
    earlier = earlier_counts(history_user, history_ms, request_user, request_ms, cap)
    return ScoredRequests(requests, scores, variant_names, variant, cohort_codes(earlier, cap))


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
    "dedupe_impressions",
    "moments_by_variant_cohort",
    "score",
]
