"""Finalisation of open requests in the live pipeline: attribution, scores, statistics rows.

Pure: the state store hands over each due request with what it has collected
(its own interactions, its user's impressions and request-less interactions, and
the user's first relevant-interaction times). The same join rules, grading,
scoring and cohort rules as ``evaluator replay`` turn them into one statistics
row per request, ready to be added to window buckets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from evaluator.cohort import cohort_codes, earlier_counts
from evaluator.join import (
    JoinOutcome,
    JoinRules,
    UserImpressions,
    count_outcomes,
    join_by_request_batch,
    join_by_user_batch,
)
from evaluator.metrics.overlap import rbo
from evaluator.metrics.setlevel import encode_top, intra_list_diversity
from evaluator.propensity_estimation import Observation, clicked_positions
from evaluator.scoring import ScoringConfig, score_sparse
from evaluator.windows import (
    AggregateLayout,
    contribution_rows,
    partition_user_buckets,
    user_buckets,
)

FloatArray = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class PendingInteraction(NamedTuple):
    """A stored interaction waiting for its request(s) to finalise."""

    event_id: str
    item_id: str
    timestamp_ms: int
    grade: float


@dataclass(slots=True)
class OpenRequest:
    """A stored impression and the interactions that named its request id."""

    request_id: str
    user_id: str
    variant: str
    timestamp_ms: int
    items: list[str]
    interactions: list[PendingInteraction] = field(default_factory=list)
    attributes: list[str] = field(default_factory=list)
    """Values of the diversity attribute, parallel to ``items`` (may be empty)."""
    shadow_variant: str = ""
    shadow: list[str] = field(default_factory=list)
    """The ranking ``shadow_variant`` would have shown (empty: none)."""
    context: str = ""
    randomization: tuple[str, int] | None = None
    """``("topn", n)`` or ``("swap", k)`` when the list was randomised."""


@dataclass(slots=True)
class UserContext:
    """What the user-based join needs about one user with request-less interactions.

    Impressions are the user's open ones, sorted by (timestamp, request id).
    """

    impression_ms: Sequence[int] = ()
    impression_ids: Sequence[str] = ()
    impression_items: Sequence[list[str]] = ()
    loose: Sequence[PendingInteraction] = ()


@dataclass(slots=True)
class History:
    """The cold-start histories of the due requests' users, as columns: each user's
    code, and one (user code, time) entry per relevant interaction kept."""

    codes: dict[str, int] = field(default_factory=dict)
    user: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ms: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


@dataclass(slots=True)
class Finalised:
    """Statistics rows of finalised requests, in the order they were given."""

    requests: list[OpenRequest]
    rows: FloatArray
    cohort: I64
    """0 = cold_start, 1 = established."""
    user_bucket: I64
    deadline_ms: I64
    outcomes: Counter[str]
    observations: list[Observation] = field(default_factory=list)
    """Per request, what the propensity estimators count (empty when not collecting)."""
    propensity_positions: int = 0
    late: int = 0
    """Set by the store's commit: interactions stored after these requests were loaded,
    so not applied (counted late, like those arriving after finalisation)."""
    experiment_rows: dict[str, npt.NDArray[np.intp]] = field(default_factory=dict)
    """Per experiment, the rows that count for its cumulative statistics (see
    :mod:`evaluator.experiments`); set by the engine."""


def deadline_ms(impression_ms: int, rules: JoinRules, allowed_lateness_ms: int) -> int:
    """Event time after which a request is final: nothing on time can still join it."""
    return (
        impression_ms + rules.attribution_window_ms + rules.max_clock_skew_ms + allowed_lateness_ms
    )


def _named(
    requests: list[OpenRequest], rules: JoinRules, outcomes: Counter[str]
) -> list[tuple[int, int, float]]:
    """Interactions that named their request, joined in one batch (as replay does)."""
    named = [(row, it) for row, r in enumerate(requests) for it in r.interactions]
    if not named:
        return []
    codes, positions = join_by_request_batch(
        [it.item_id for _, it in named],
        np.fromiter((it.timestamp_ms for _, it in named), dtype=np.int64, count=len(named)),
        [row for row, _ in named],
        np.fromiter((r.timestamp_ms for r in requests), dtype=np.int64, count=len(requests)),
        [r.items for r in requests],
        rules=rules,
    )
    count_outcomes(codes, outcomes)
    return [
        (row, pos, it.grade)
        for (row, it), code, pos in zip(named, codes.tolist(), positions.tolist(), strict=True)
        if code == 0
    ]


def _loose(
    requests: list[OpenRequest],
    users: dict[str, UserContext],
    rules: JoinRules,
    outcomes: Counter[str],
) -> list[tuple[int, int, float]]:
    """Request-less interactions whose user-based join picks one of ``requests``
    (the batch join replay uses, over every user with such interactions)."""
    row_of = {r.request_id: row for row, r in enumerate(requests)}
    mine = [ctx for ctx in users.values() if ctx.loose and ctx.impression_ms]
    if not mine:
        return []
    loose = [it for ctx in mine for it in ctx.loose]
    codes, chosen, positions = join_by_user_batch(
        [it.item_id for it in loose],
        np.fromiter((it.timestamp_ms for it in loose), dtype=np.int64, count=len(loose)),
        np.repeat(np.arange(len(mine), dtype=np.int64), [len(ctx.loose) for ctx in mine]),
        UserImpressions(  # each user's impressions are sorted already; users follow in order
            np.repeat(
                np.arange(len(mine), dtype=np.int64), [len(ctx.impression_ms) for ctx in mine]
            ),
            np.fromiter((t for ctx in mine for t in ctx.impression_ms), dtype=np.int64),
            [items for ctx in mine for items in ctx.impression_items],
        ),
        rules=rules,
        classify=False,  # only attributions are counted here
    )
    ids = [rid for ctx in mine for rid in ctx.impression_ids]
    out: list[tuple[int, int, float]] = []
    for i in np.flatnonzero(codes == 0).tolist():
        row = row_of.get(ids[chosen[i]])
        if row is not None:
            out.append((row, int(positions[i]), loose[i].grade))
    if out:
        outcomes[JoinOutcome.ATTRIBUTED] += len(out)
    return out


def _earlier_relevant(
    requests: list[OpenRequest], history: History, request_ms: I64, cap: int
) -> I64:
    """Relevant interactions of each request's user before its impression (the same
    vectorised count ``evaluator replay`` uses)."""
    codes = history.codes
    request_user = np.fromiter(
        map(codes.get, [r.user_id for r in requests], repeat(-1)),
        dtype=np.int64,
        count=len(requests),
    )
    return earlier_counts(history.user, history.ms, request_user, request_ms, cap)


@dataclass(frozen=True, slots=True)
class FinaliseConfig:
    """Everything finalisation needs, as plain values."""

    rules: JoinRules
    scoring: ScoringConfig
    layout: AggregateLayout
    min_relevant_history: int = 3
    allowed_lateness_ms: int = 60_000
    rbo_p: float = 0.9
    propensity_positions: int = 0
    """Positions counted for propensity estimation; 0: not collecting."""

    def deadline(self, impression_ms: int) -> int:
        return deadline_ms(impression_ms, self.rules, self.allowed_lateness_ms)


def finalise(
    requests: list[OpenRequest],
    users: dict[str, UserContext],
    config: FinaliseConfig,
    partition: int | None = None,
    history: History | None = None,
) -> Finalised:
    """Score due requests; the caller adds the rows to the window buckets atomically.

    ``users``: the due requests' users with request-less interactions; ``history``:
    their cold-start histories (None: none).

    ``partition``: the requests belong to that partition's shard (the partition-owned
    engine); None: users are spread over shards by hash (the shared-state pipeline)."""
    rules, layout = config.rules, config.layout
    outcomes: Counter[str] = Counter()
    entries = _named(requests, rules, outcomes) + _loose(requests, users, rules, outcomes)
    arr = np.asarray(entries, dtype=np.float64).reshape(-1, 3)
    scores = score_sparse(
        len(requests),
        arr[:, 0].astype(np.int64),
        arr[:, 1].astype(np.int64),
        arr[:, 2],
        config.scoring,
    )
    impression_ms = np.fromiter(
        (r.timestamp_ms for r in requests), dtype=np.int64, count=len(requests)
    )
    cap = config.min_relevant_history
    earlier = _earlier_relevant(requests, history or History(), impression_ms, cap)
    cohort = cohort_codes(earlier, cap) - 1
    deadlines = impression_ms + config.deadline(0)  # a constant delay after each impression
    codes = encode_top([r.attributes for r in requests], max(config.scoring.ks))
    diversity = np.column_stack(
        [intra_list_diversity(codes[:, :k]) for k in config.scoring.ks]
    ).reshape(len(requests), len(config.scoring.ks))
    overlap = np.array(
        [rbo(r.items, r.shadow, config.rbo_p) if r.shadow else np.nan for r in requests]
    )
    return Finalised(
        requests,
        contribution_rows(scores, diversity, overlap),
        cohort.astype(np.int64),
        user_buckets([r.user_id for r in requests], layout)
        if partition is None
        else partition_user_buckets([r.user_id for r in requests], layout, partition),
        deadlines,
        outcomes,
        observations(requests, entries) if config.propensity_positions else [],
        config.propensity_positions,
    )


def observations(
    requests: list[OpenRequest], entries: list[tuple[int, int, float]]
) -> list[Observation]:
    """What each request tells the propensity estimators: its clicked positions."""
    rows, positions, grades = zip(*entries, strict=True) if entries else ((), (), ())
    clicked = clicked_positions(len(requests), rows, positions, grades)
    return [
        Observation(r.context, r.items, c, r.randomization)
        for r, c in zip(requests, clicked, strict=True)
    ]
