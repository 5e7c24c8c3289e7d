"""Join rules: which impression an interaction is attributed to.

The rules are defined on event time only, so the result does not depend on the
order in which events arrive. That is what lets the live pipeline and
``evaluator replay`` agree.

* An interaction at time t may be attributed to an impression at time s when
  ``s - max_clock_skew <= t <= s + attribution_window``.
* With a ``request_id`` it joins that request, provided the item was in its list.
* Without one it joins the same user's most recent impression (largest s, ties
  broken by the larger request id) that contains the item and whose window
  holds t.
"""

from __future__ import annotations

import bisect
import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from evaluator.core.due import ItemKey, Ragged


@dataclass(frozen=True, slots=True)
class JoinRules:
    """Attribution window and tolerated clock skew, in milliseconds."""

    attribution_window_ms: int = 30 * 60_000
    max_clock_skew_ms: int = 5_000

    def __post_init__(self) -> None:
        if self.attribution_window_ms <= 0:
            raise ValueError("attribution_window must be > 0")
        if self.max_clock_skew_ms < 0:
            raise ValueError("max_clock_skew must be >= 0")


class JoinOutcome(enum.StrEnum):
    """What happened to one interaction; every non-attributed outcome is counted."""

    ATTRIBUTED = "attributed"
    NO_IMPRESSION = "no_impression"
    """No impression with that request id, or none at all for that user."""
    NOT_IN_LIST = "not_in_list"
    """The impression(s) did not show the item."""
    OUTSIDE_WINDOW = "outside_window"
    """The item was shown, but not within the attribution window."""


def in_window(interaction_ms: int, impression_ms: int, rules: JoinRules) -> bool:
    """Whether an interaction time falls in an impression's attribution window."""
    return (
        impression_ms - rules.max_clock_skew_ms
        <= interaction_ms
        <= impression_ms + rules.attribution_window_ms
    )


def in_window_mask(
    interaction_ms: npt.NDArray[np.int64], impression_ms: npt.NDArray[np.int64], rules: JoinRules
) -> npt.NDArray[np.bool_]:
    """Vectorised :func:`in_window`."""
    lo = impression_ms - rules.max_clock_skew_ms
    hi = impression_ms + rules.attribution_window_ms
    return (interaction_ms >= lo) & (interaction_ms <= hi)


def impression_range(interaction_ms: int, rules: JoinRules) -> tuple[int, int]:
    """Impression times [lo, hi] whose window contains ``interaction_ms``."""
    return (
        interaction_ms - rules.attribution_window_ms,
        interaction_ms + rules.max_clock_skew_ms,
    )


OUTCOME_CODES: tuple[JoinOutcome, ...] = (
    JoinOutcome.ATTRIBUTED,
    JoinOutcome.NO_IMPRESSION,
    JoinOutcome.NOT_IN_LIST,
    JoinOutcome.OUTSIDE_WINDOW,
)
"""Outcome of each code returned by :func:`join_by_request_batch`."""


def join_by_request_batch(
    item_ids: Sequence[ItemKey] | npt.NDArray[np.int64],
    interaction_ms: npt.NDArray[np.int64],
    rows: Sequence[int] | npt.NDArray[np.int64],
    impression_ms: npt.NDArray[np.int64],
    lists: Sequence[Sequence[ItemKey]] | Ragged,
    *,
    rules: JoinRules,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
    """Join many interactions to the requests they name, at once.

    ``rows[i]`` is the request interaction i names (-1: unknown), indexing
    ``impression_ms`` and ``lists``. Returns an index into :data:`OUTCOME_CODES`
    and the 0-based position of the item (-1 unless attributed) for each interaction.
    ``lists`` may be a :class:`Ragged` of item codes (the live engine's); the items
    are then codes too, and every position is found by one search
    (:meth:`Ragged.positions`, the first as ``list.index`` finds it).
    """
    if isinstance(lists, Ragged):
        row_arr = np.asarray(rows, dtype=np.int64)
        positions = lists.positions(row_arr, np.asarray(item_ids, dtype=np.int64))
        return request_outcomes(positions, row_arr, interaction_ms, impression_ms, rules)
    positions = np.fromiter(
        (
            (items.index(item) if item in items else -1) if row >= 0 else -2
            for row, item in zip(rows, item_ids, strict=True)
            for items in (lists[row] if row >= 0 else (),)
        ),
        dtype=np.int64,
        count=len(item_ids),
    )
    return request_outcomes(
        positions, np.asarray(rows, dtype=np.int64), interaction_ms, impression_ms, rules
    )


def request_outcomes(
    positions: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    interaction_ms: npt.NDArray[np.int64],
    impression_ms: npt.NDArray[np.int64],
    rules: JoinRules,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int64]]:
    """The outcome codes of interactions naming requests (:func:`join_by_request_batch`)
    from each one's request row (-1: unknown) and its item's position in that request's
    list (-1: not in it); also the positions, -1 unless attributed."""
    positions = np.where(rows >= 0, positions, -2)
    if len(impression_ms):
        shown = np.where(rows >= 0, impression_ms[np.maximum(rows, 0)], 0)
    else:  # no impression at all: every interaction names an unknown request
        shown = np.zeros(len(rows), dtype=np.int64)
    codes = np.zeros(len(rows), dtype=np.int8)
    codes[~in_window_mask(interaction_ms, shown, rules)] = 3
    codes[positions == -1] = 2
    codes[positions == -2] = 1
    positions[codes != 0] = -1
    return codes, positions


def join_by_request(
    item_id: str,
    interaction_ms: int,
    impression_ms: int | None,
    items: Sequence[str] | None,
    rules: JoinRules,
) -> tuple[JoinOutcome, int]:
    """Join one interaction to a named request (``items`` is None when it is unknown).

    Returns the outcome and the 0-based position of the item (-1 unless attributed).
    A convenience over :func:`join_by_request_batch`, the one implementation of this
    rule (replay and live finalisation call the batch form).
    """
    known = items is not None and impression_ms is not None
    codes, positions = join_by_request_batch(
        [item_id],
        np.array([interaction_ms], dtype=np.int64),
        [0 if known else -1],
        np.array([impression_ms if known else 0], dtype=np.int64),
        [items if items is not None else ()],
        rules=rules,
    )
    return OUTCOME_CODES[int(codes[0])], int(positions[0])


def count_outcomes(codes: npt.NDArray[np.int8], outcomes: Counter[str]) -> None:
    """Add the outcome codes of :func:`join_by_request_batch` to a counter (non-zero only)."""
    for code, count in enumerate(np.bincount(codes, minlength=len(OUTCOME_CODES)).tolist()):
        if count:
            outcomes[OUTCOME_CODES[code]] += count


def join_by_user(
    item_id: ItemKey,
    interaction_ms: int,
    timestamps: Sequence[int],
    lists: Sequence[Sequence[ItemKey]],
    rules: JoinRules,
) -> tuple[JoinOutcome, int, int]:
    """Join to the user's most recent impression that showed the item in the window.

    ``timestamps`` and ``lists`` describe the user's impressions sorted by
    ``(timestamp, request_id)``. Returns the outcome, the index of the chosen
    impression and the 0-based position of the item in it.
    """
    if not timestamps:
        return JoinOutcome.NO_IMPRESSION, -1, -1
    lo, hi = impression_range(interaction_ms, rules)
    for idx in range(bisect.bisect_right(timestamps, hi) - 1, -1, -1):
        if timestamps[idx] < lo:
            break
        items = lists[idx]
        if item_id in items:
            return JoinOutcome.ATTRIBUTED, idx, items.index(item_id)
    if any(item_id in items for items in lists):
        return JoinOutcome.OUTSIDE_WINDOW, -1, -1
    return JoinOutcome.NOT_IN_LIST, -1, -1


def user_order(
    user: npt.NDArray[np.int64], ms: npt.NDArray[np.int64], request_ids: Sequence[str]
) -> npt.NDArray[np.int64]:
    """Indices that sort impressions by (user code, timestamp, request id), the order
    :func:`join_by_user_batch` needs. Request ids are only compared on ties."""
    order = np.lexsort((ms, user))
    u, t = user[order], ms[order]
    if order.size > 1 and ((u[1:] == u[:-1]) & (t[1:] == t[:-1])).any():
        ids = np.array(request_ids, dtype=object)
        order = np.array(sorted(range(user.size), key=lambda r: (user[r], ms[r], ids[r])))
    return order.astype(np.int64)


class UserImpressions(NamedTuple):
    """Impressions sorted by (user code, timestamp, request id); see :func:`user_order`.
    ``lists``: each one's items, or their integer codes as one :class:`Ragged` (then
    the interactions' items are codes too, -1 for one in no list)."""

    user: npt.NDArray[np.int64]
    ms: npt.NDArray[np.int64]
    lists: Sequence[Sequence[ItemKey]] | Ragged


def join_by_user_batch(
    item_ids: Sequence[ItemKey] | npt.NDArray[np.int64],
    interaction_ms: npt.NDArray[np.int64],
    interaction_user: npt.NDArray[np.int64],
    impressions: UserImpressions,
    *,
    rules: JoinRules,
    classify: bool = True,
) -> UserJoin:
    """:func:`join_by_user` for many interactions of many users at once.

    ``classify=False``: an interaction not attributed gets code 2 whatever the reason
    (the caller only counts attributions), sparing the search of all its user's lists.

    Users are integer codes (an interaction's user may be -1: no impressions).
    Returns an index into :data:`OUTCOME_CODES`, the chosen
    impression (-1 unless attributed) and the item's 0-based position (-1 unless
    attributed) for each interaction. The candidate ranges come from binary
    searches; only the membership tests run per interaction.
    """
    n = len(item_ids)
    impression_user, impression_ms, lists = impressions
    if n == 0 or impression_user.size == 0:
        return np.full(n, 1, np.int8), np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    window, skew = rules.attribution_window_ms, rules.max_clock_skew_ms
    t0 = min(int(impression_ms.min()), int(interaction_ms.min()) - window)
    span = max(int(impression_ms.max()), int(interaction_ms.max()) + skew) - t0 + 1
    users = int(max(impression_user.max(), interaction_user.max())) + 2
    if users * span >= 2**62:  # pragma: no cover - astronomically wide keys
        return join_by_user_each(
            item_ids, interaction_ms, interaction_user, impressions, rules=rules
        )
    key = (impression_user + 1) * span + (impression_ms - t0)
    base = (interaction_user + 1) * span - t0
    bounds = (
        np.searchsorted(key, base + interaction_ms - window, side="left"),
        np.searchsorted(key, base + interaction_ms + skew, side="right"),
        np.searchsorted(impression_user, interaction_user, side="left"),
        np.searchsorted(impression_user, interaction_user, side="right"),
    )
    if isinstance(lists, Ragged):
        return _join_coded(np.asarray(item_ids, dtype=np.int64), lists, bounds, classify=classify)
    first, last, start, stop = (b.tolist() for b in bounds)
    codes, chosen, positions = [0] * n, [-1] * n, [-1] * n
    for i, item in enumerate(item_ids):
        for j in range(last[i] - 1, first[i] - 1, -1):
            items = lists[j]
            if item in items:
                chosen[i], positions[i] = j, items.index(item)
                break
        else:
            s, e = start[i], stop[i]
            if not classify:
                codes[i] = 2
            else:
                codes[i] = 1 if s == e else 3 if any(item in lists[j] for j in range(s, e)) else 2
    return _user_join_arrays(codes, chosen, positions)


def _join_coded(
    items: npt.NDArray[np.int64],
    lists: Ragged,
    bounds: tuple[npt.NDArray[np.int64], ...],
    *,
    classify: bool,
) -> UserJoin:
    """:func:`join_by_user_batch` over item codes, in arrays: every (interaction,
    candidate impression) pair at once, the latest impression holding the item chosen.
    ``bounds``: each interaction's candidates ``[first, last)`` and its user's
    impressions ``[start, stop)``."""
    n = items.size
    first, last, start, stop = bounds
    pair, at = _pairs(first, last)
    position = lists.positions(at, items[pair])
    hits = np.flatnonzero(position >= 0)[::-1]  # latest candidate first
    taken, latest = np.unique(pair[hits], return_index=True)
    chosen, positions = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    chosen[taken], positions[taken] = at[hits[latest]], position[hits[latest]]
    codes = np.where(chosen >= 0, 0, 2).astype(np.int8)
    if classify:
        codes[(chosen < 0) & (start == stop)] = 1
        pair, at = _pairs(start, stop)
        shown = np.zeros(n, dtype=np.bool_)
        shown[pair[lists.positions(at, items[pair]) >= 0]] = True
        codes[(chosen < 0) & shown] = 3
    return codes, chosen, positions


def _pairs(
    lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Every (i, j) with ``lo[i] <= j < hi[i]``, in order of i then j."""
    counts = np.maximum(hi - lo, 0)
    pair = np.repeat(np.arange(lo.size), counts)
    start = np.cumsum(counts) - counts
    return pair, np.repeat(lo - start, counts) + np.arange(int(counts.sum()))


def join_by_user_each(
    item_ids: Sequence[ItemKey] | npt.NDArray[np.int64],
    interaction_ms: npt.NDArray[np.int64],
    interaction_user: npt.NDArray[np.int64],
    impressions: UserImpressions,
    *,
    rules: JoinRules,
) -> UserJoin:
    """The same as :func:`join_by_user_batch`, one :func:`join_by_user` call each
    (the fallback for keys too wide to combine, and a reference in tests)."""
    impression_user, impression_ms, lists = impressions
    if isinstance(lists, Ragged):
        lists = lists.lists()
    if isinstance(item_ids, np.ndarray):
        item_ids = item_ids.tolist()
    code_of = {outcome: code for code, outcome in enumerate(OUTCOME_CODES)}
    codes, chosen, positions = [], [], []
    for item, t, u in zip(
        item_ids, interaction_ms.tolist(), interaction_user.tolist(), strict=True
    ):
        s = int(np.searchsorted(impression_user, u, side="left"))
        e = int(np.searchsorted(impression_user, u, side="right"))
        outcome, idx, pos = join_by_user(item, t, impression_ms[s:e].tolist(), lists[s:e], rules)
        codes.append(code_of[outcome])
        chosen.append(s + idx if idx >= 0 else -1)
        positions.append(pos)
    return _user_join_arrays(codes, chosen, positions)


UserJoin = tuple[npt.NDArray[np.int8], npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""Outcome codes, chosen impressions and item positions of :func:`join_by_user_batch`."""


def _user_join_arrays(codes: list[int], chosen: list[int], positions: list[int]) -> UserJoin:
    return (
        np.array(codes, dtype=np.int8),
        np.array(chosen, dtype=np.int64),
        np.array(positions, dtype=np.int64),
    )
