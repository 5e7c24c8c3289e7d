"""The columns finalisation reads: ragged lists' lookups and the (time, request id) order."""

from __future__ import annotations

import random

import numpy as np
import pytest

from evaluator.core.due import (
    OpenRequest,
    PendingInteraction,
    Ragged,
    due_of,
    requests_of,
    time_order,
)
from evaluator.core.metrics.setlevel import encode_top


def _lists(rng: random.Random, n: int) -> list[list[int]]:
    return [[rng.randrange(12) for _ in range(rng.randrange(0, 8))] for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("lookups", [1, 8, 200])
def test_positions_agree_with_list_index(seed: int, lookups: int) -> None:
    """The first position of each value in its row, as ``list.index`` finds it (lists
    may repeat a value; a negative value or row is absent): by the gather of the rows
    looked up (few lookups) or by one sort (more values looked at than held)."""
    rng = random.Random(seed)
    lists = _lists(rng, 30)
    ragged = Ragged.of_lists(lists)
    rows = [rng.randrange(-1, 30) for _ in range(lookups)]
    values = [rng.randrange(-1, 14) for _ in range(lookups)]
    expected = [
        lists[r].index(v) if r >= 0 and v in lists[r] else -1
        for r, v in zip(rows, values, strict=True)
    ]
    arrays = np.array(rows, dtype=np.int64), np.array(values, dtype=np.int64)
    assert ragged.positions(*arrays).tolist() == expected
    assert ragged._sorted_positions(*arrays).tolist() == expected


def test_positions_in_empty_rows_are_absent() -> None:
    ragged = Ragged.of_lists([[], [4, 5], []])
    got = ragged.positions(np.array([0, 2, 1], dtype=np.int64), np.array([4, 4, 5], dtype=np.int64))
    assert got.tolist() == [-1, -1, 1]


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_has_the_equalities_of_encode_top(k: int) -> None:
    """The top-k matrix keeps each value where ``encode_top`` puts its code (codes
    differ, equality and padding do not)."""
    lists = _lists(random.Random(k), 25)
    got = Ragged.of_lists(lists).top(k)
    reference = encode_top(lists, k)
    assert got.shape == reference.shape
    assert ((got < 0) == (reference < 0)).all()
    for a, b in zip(got.tolist(), reference.tolist(), strict=True):
        assert [[x == y for y in a] for x in a] == [[x == y for y in b] for x in b]


@pytest.mark.parametrize("seed", range(5))
def test_time_order_sorts_by_time_then_request_id(seed: int) -> None:
    """Ties (not only adjacent ones) fall back to the request ids' string order."""
    rng = random.Random(seed)
    ids = [f"req-{rng.randrange(1000)}-é" for _ in range(40)]
    ms = np.array([rng.randrange(6) for _ in ids], dtype=np.int64)
    order = time_order(ms, ids)
    got = list(range(len(ids))) if order is None else order.tolist()
    assert [(int(ms[i]), ids[i]) for i in got] == sorted(zip(ms.tolist(), ids, strict=True))
    in_order = sorted(range(len(ids)), key=lambda i: (int(ms[i]), ids[i]))
    assert time_order(ms[in_order], [ids[i] for i in in_order]) is None


def test_requests_round_trip_through_columns() -> None:
    """Objects to columns (items coded) and back, interactions with their requests."""
    requests = [
        OpenRequest(
            "r1",
            "u1",
            "a",
            5,
            ("x", "y"),
            [PendingInteraction("e1", "y", 9, 1.0), PendingInteraction("e2", "z", 9, 3.0)],
            ("c1", "c2"),
            "ctl",
            ("y", "x"),
            "home",
            ("topn", 2),
        ),
        OpenRequest("r2", "u2", "b", 7, ("z",)),
    ]
    due, names = due_of(requests)
    assert requests_of(due, names) == requests
    assert requests_of(due.take(np.array([1, 0])), names) == requests[::-1]
