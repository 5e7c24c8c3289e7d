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
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.interleaving import Credited, credit
from evaluator.core.cohort import cohort_codes, earlier_counts
from evaluator.core.due import Due, ItemKey, OpenRequest, Ragged, due_of, requests_of
from evaluator.core.join import (
    JoinOutcome,
    JoinRules,
    UserImpressions,
    count_outcomes,
    join_by_request_batch,
    join_by_user_batch,
)
from evaluator.core.maturity import partial_ndcg
from evaluator.core.metrics.overlap import rbo
from evaluator.core.metrics.setlevel import intra_list_diversity
from evaluator.core.propensity.estimation import Observation, clicked_positions
from evaluator.core.scoring import ScoringConfig, score_sparse
from evaluator.core.sketch import U64, hash_strings
from evaluator.core.windows import (
    AggregateLayout,
    contribution_rows,
    partition_user_buckets,
    user_buckets,
)

FloatArray = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


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

    due: Due
    """The requests, as columns (lists as codes of :attr:`names`)."""
    rows: FloatArray
    cohort: I64
    """0 = cold_start, 1 = established."""
    user_bucket: I64
    deadline_ms: I64
    outcomes: Counter[str]
    names: Sequence[str] = ()
    """The strings the requests' items are codes of (the partition's codebook)."""
    name_hashes: U64 | None = None
    """Stable hashes (``hash_strings``) of the names: each distinct item hashed once
    (None: hashed when asked)."""
    observations: list[Observation] = field(default_factory=list)
    """Per request, what the propensity estimators count (empty when not collecting)."""
    propensity_positions: int = 0
    late: int = 0
    """Set by the store's commit: interactions stored after these requests were loaded,
    so not applied (counted late, like those arriving after finalisation)."""
    loose_taken: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    """Indexes (in the :class:`LooseJoin`'s interactions) of the request-less
    interactions these requests took: each is attributed once, so the engine forgets
    them (an impression arriving after its deadline cannot take them again)."""
    experiment_rows: dict[str, npt.NDArray[np.intp]] = field(default_factory=dict)
    """Per experiment, the rows that count for its cumulative statistics (see
    :mod:`evaluator.core.experiments`); set by the engine."""
    interleaving: Credited | None = None
    """Interleaved requests' ranker pairs and outcomes (None: none was interleaved)."""
    maturity: tuple[FloatArray, npt.NDArray[np.bool_]] | None = None
    """The requests scored at the maturity curve's ages
    (:func:`evaluator.core.maturity.partial_ndcg`; None: no curve kept)."""

    @classmethod
    def of(
        cls,
        requests: Sequence[OpenRequest],
        rows: FloatArray,
        cohort: I64,
        user_bucket: I64,
        deadline_ms: I64,
    ) -> Finalised:
        """Rows of request objects (items as strings): tests and benchmarks."""
        due, names = due_of(requests)
        return cls(due, rows, cohort, user_bucket, deadline_ms, Counter(), names)

    def __len__(self) -> int:
        return len(self.due)

    @property
    def requests(self) -> list[OpenRequest]:
        """The requests as objects, item ids decoded (built on each call: for readers
        that want one object per request, not for the live path)."""
        return requests_of(self.due, self.names)

    def shown(self) -> list[list[str]]:
        """Each request's item ids (what coverage counts)."""
        names = self.names
        return [[names[c] for c in row] for row in self.due.items.lists()]

    def item_hashes(self, codes: npt.NDArray[np.integer[Any]]) -> U64:
        """Stable hashes of the given item codes."""
        if self.name_hashes is None:
            self.name_hashes = hash_strings(list(self.names))
        return self.name_hashes[codes.astype(np.intp)]


def deadline_ms(impression_ms: int, rules: JoinRules, allowed_lateness_ms: int) -> int:
    """Event time after which a request is final: nothing on time can still join it."""
    return (
        impression_ms + rules.attribution_window_ms + rules.max_clock_skew_ms + allowed_lateness_ms
    )


class Attributed(NamedTuple):
    """Attributed interactions as columns: the request row each joined, the item's
    0-based position in its list, its grade, and the interaction's time."""

    row: I64
    position: I64
    grade: FloatArray
    ms: I64

    @staticmethod
    def join(parts: Sequence[Attributed]) -> Attributed:
        """The parts one after another (their order is kept)."""
        if not parts:
            empty = np.zeros(0, np.int64)
            return Attributed(empty, empty, np.zeros(0), empty)
        return Attributed(*(np.concatenate(columns) for columns in zip(*parts, strict=True)))

    def within(self, request_ms: I64, age_ms: int) -> Attributed:
        """Only the interactions at most ``age_ms`` after their request's impression
        (``request_ms`` per row): what was known of the requests at that age."""
        keep = self.ms <= request_ms[self.row] + age_ms
        return Attributed(self.row[keep], self.position[keep], self.grade[keep], self.ms[keep])


def attribute_named(
    request_ms: I64,
    request_items: Sequence[Sequence[ItemKey]] | Ragged,
    interactions: NamedInteractions,
    rules: JoinRules,
    outcomes: Counter[str],
) -> Attributed:
    """Interactions that name their request, joined in one batch; every outcome is
    counted. ``interactions.row`` is each one's request row (-1: unknown request)."""
    rows, items, times, grades = interactions
    if not len(items):
        return Attributed.join([])
    codes, positions = join_by_request_batch(
        items, times, rows, request_ms, request_items, rules=rules
    )
    count_outcomes(codes, outcomes)
    ok = np.flatnonzero(codes == 0)
    rows = np.asarray(rows, dtype=np.int64)
    return Attributed(rows[ok], positions[ok], grades[ok], np.asarray(times, np.int64)[ok])


def attribute_loose(
    impressions: UserImpressions,
    impression_row: I64,
    interactions: LooseInteractions,
    rules: JoinRules,
    outcomes: Counter[str],
    *,
    classify: bool,
) -> tuple[Attributed, I64]:
    """Request-less interactions, each joined to its user's latest impression holding
    the item (one batch); also the indexes of the interactions attributed.
    ``impression_row``: each impression's request row, -1 for an impression that is
    not being finalised (its attributions are left to it).

    ``classify=True`` counts every outcome (replay: every impression is being
    finalised); False counts attributions only (live: an interaction not attributed
    now may still join a later request)."""
    users, items, times, grades = interactions
    if not len(items):
        return Attributed.join([]), np.zeros(0, np.int64)
    codes, chosen, positions = join_by_user_batch(
        items, times, users, impressions, rules=rules, classify=classify
    )
    rows = (
        impression_row[np.maximum(chosen, 0)] if impression_row.size else np.full_like(chosen, -1)
    )
    ok = np.flatnonzero((codes == 0) & (rows >= 0))
    if classify:
        count_outcomes(codes, outcomes)
    elif ok.size:
        outcomes[JoinOutcome.ATTRIBUTED] += int(ok.size)
    attributed = Attributed(rows[ok], positions[ok], grades[ok], np.asarray(times, np.int64)[ok])
    return attributed, ok


class NamedInteractions(NamedTuple):
    """Interactions naming a request, as columns (``row``: the request's row)."""

    row: Sequence[int] | I64
    item: Sequence[ItemKey] | I64
    """Item ids, or codes (with the requests' lists as a ``Ragged`` of codes)."""
    ms: I64
    grade: FloatArray


class LooseInteractions(NamedTuple):
    """Request-less interactions, as columns (``user``: the user's code in the
    :class:`~evaluator.core.join.UserImpressions` they are joined against)."""

    user: I64
    item: Sequence[ItemKey] | I64
    """Item ids, or codes (with impressions' lists as a ``Ragged`` of codes)."""
    ms: I64
    grade: FloatArray


class LooseJoin(NamedTuple):
    """What the user-based join of the due requests' users needs, as columns: their
    open impressions (sorted by user code, time, request id) with each one's request
    id, and their request-less interactions (user codes as in ``impressions``)."""

    impressions: UserImpressions
    impression_ids: Sequence[str]
    interactions: LooseInteractions


def join_due(
    due: Due, loose: LooseJoin | None, rules: JoinRules, outcomes: Counter[str]
) -> tuple[Attributed, I64]:
    """The due requests' attributed interactions: those naming them, then the
    request-less ones their users' join gives them; also the indexes (in
    ``loose.interactions``) of the request-less ones taken."""
    parts = [_named(due, rules, outcomes)]
    taken = np.zeros(0, np.int64)
    if loose is not None:
        loose_part, taken = _loose(due.request_id, loose, rules, outcomes)
        parts.append(loose_part)
    return Attributed.join(parts), taken


def _named(due: Due, rules: JoinRules, outcomes: Counter[str]) -> Attributed:
    """The due requests' own interactions (they name their request's row)."""
    named = due.named
    return attribute_named(
        due.ms,
        due.items,
        NamedInteractions(named.row, named.item, named.ms, named.grade),
        rules,
        outcomes,
    )


def _loose(
    request_ids: Sequence[str], loose: LooseJoin, rules: JoinRules, outcomes: Counter[str]
) -> tuple[Attributed, I64]:
    """Request-less interactions whose user-based join picks one of the requests, and
    their indexes in ``loose.interactions``."""
    row_of = {rid: row for row, rid in enumerate(request_ids)}
    impression_row = np.fromiter(
        map(row_of.get, loose.impression_ids, repeat(-1)),
        dtype=np.int64,
        count=len(loose.impression_ids),
    )
    return attribute_loose(
        loose.impressions, impression_row, loose.interactions, rules, outcomes, classify=False
    )


def cohorts(request_users: Sequence[str], request_ms: I64, history: History, cap: int) -> I64:
    """``COLD_START`` or ``ESTABLISHED`` for each request, from its user's relevant
    interactions strictly before it (at most ``cap`` counted)."""
    codes = history.codes
    request_user = np.fromiter(
        map(codes.get, request_users, repeat(-1)), dtype=np.int64, count=len(request_users)
    )
    earlier = earlier_counts(history.user, history.ms, request_user, request_ms, cap)
    return cohort_codes(earlier, cap)


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
    due: Due,
    loose: LooseJoin | None,
    config: FinaliseConfig,
    partition: int | None = None,
    history: History | None = None,
    *,
    names: Sequence[str],
    name_hashes: U64 | None = None,
) -> Finalised:
    """Score due requests; the caller adds the rows to the window buckets atomically.

    ``due``: the requests and the interactions naming them, lists as codes of
    ``names`` (of stable hashes ``name_hashes``); ``loose``: the due requests' users
    with request-less interactions (None: none); ``history``: their cold-start
    histories (None: none).

    ``partition``: the requests belong to that partition's shard (the partition-owned
    engine); None: users are spread over shards by hash (the shared-state pipeline)."""
    layout, ks = config.layout, config.scoring.ks
    outcomes: Counter[str] = Counter()
    n = len(due)
    attributed, taken = join_due(due, loose, config.rules, outcomes)
    scores = score_sparse(n, *attributed[:3], config.scoring)
    cap = config.min_relevant_history
    cohort = cohorts(due.user_id, due.ms, history or History(), cap) - 1
    deadlines = due.ms + config.deadline(0)  # a constant delay after each impression
    codes = due.attributes.top(max(ks))
    diversity = np.column_stack([intra_list_diversity(codes[:, :k]) for k in ks])
    done = Finalised(
        due,
        contribution_rows(
            scores, diversity.reshape(n, len(ks)), _overlap(due, config.rbo_p), layout.schema
        ),
        cohort,
        user_buckets(due.user_id, layout)
        if partition is None
        else partition_user_buckets(due.user_id, layout, partition),
        deadlines,
        outcomes,
        names,
        name_hashes,
        propensity_positions=config.propensity_positions,
        loose_taken=taken,
    )
    if due.draft is not None:
        done.interleaving = credit(due.draft, *attributed[:3])
    if layout.maturity_ages_ms and layout.history_keep_ms:
        final, ages = scores.values["ndcg"], layout.maturity_ages_ms
        done.maturity = partial_ndcg(attributed, due.ms, final, ages, config.scoring)
    if config.propensity_positions:
        done.observations = observations(due.context, done.shown(), due.randomization, attributed)
    return done


def _overlap(due: Due, p: float) -> FloatArray:
    """Rank-biased overlap of each list with its shadow ranking (NaN: none)."""
    out = np.full(len(due), np.nan)
    has = np.flatnonzero(due.shadow.lengths() > 0)
    if has.size:
        pairs = zip(due.items.rows(has), due.shadow.rows(has), strict=True)
        out[has] = [rbo(items, shadow, p) for items, shadow in pairs]
    return out


def observations(
    contexts: Sequence[str],
    lists: Sequence[Sequence[str]],
    randomizations: Sequence[tuple[str, int] | None],
    attributed: Attributed,
) -> list[Observation]:
    """What each request tells the propensity estimators: its context, its list, its
    randomisation, and the positions it had a relevant attribution at."""
    clicked = clicked_positions(len(lists), *(c.tolist() for c in attributed[:3]))
    return [
        Observation(context, items, c, rnd)
        for context, items, c, rnd in zip(contexts, lists, clicked, randomizations, strict=True)
    ]
