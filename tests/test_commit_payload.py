"""What a checkpoint adds to blocks and coverage sketches, against per-request references.

The payload functions work over arrays; the references below walk the requests one
by one, as the documented rules read."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest

from evaluator.core.due import OpenRequest, Ragged
from evaluator.core.finalise import Finalised
from evaluator.core.sketch import hash_strings
from evaluator.core.windows import AggregateLayout
from evaluator.engine.codebook import Codebook
from evaluator.engine.commit_payload import USERS, block_increments, coverage_updates

T0 = 1_700_000_000_000


def _key(window: int, start: int, variant: str, k: int) -> str:
    return f"{window}:{start}:{variant}:{k}"


def _finalised(seed: int, layout: AggregateLayout) -> Finalised:
    rng = random.Random(seed)
    n = rng.randrange(1, 200)
    requests = [
        OpenRequest(
            f"r{i}",
            f"u{i}",
            rng.choice("ABC"),
            0,
            list(dict.fromkeys(f"p{rng.randrange(150)}" for _ in range(rng.randrange(1, 30)))),
        )
        for i in range(n)
    ]
    deadlines = np.array([T0 + rng.randrange(0, 10**8) for _ in range(n)], dtype=np.int64)
    rows = np.asarray([[rng.random() for _ in range(layout.row_width)] for _ in range(n)])
    return Finalised.of(
        requests,
        rows,
        np.array([rng.randrange(2) for _ in range(n)], dtype=np.int64),
        np.array([rng.randrange(layout.user_buckets) for _ in range(n)], dtype=np.int64),
        deadlines,
    )


def _start(window: int, t_ms: int, layout: AggregateLayout) -> int:
    width = layout.bucket_width(window)
    return t_ms - t_ms % width


LAYOUTS = [
    AggregateLayout(ks=(5, 10, 20), shards=4),
    AggregateLayout(ks=(10,), shards=4),
    AggregateLayout(ks=(1, 3), shards=4, windows_ms=(60_000, 600_000)),
]


def _contents(update) -> dict[str, set[int]]:
    """Each sketch's item hashes of the batch: its own positions and the sketches it
    holds (which must come earlier)."""
    out: dict[str, set[int]] = {}
    for key, (positions, held) in update.sketches.items():
        assert all(other in out for other in held), key
        own = set(update.hashes[positions].tolist())
        out[key] = own.union(*(out[o] for o in held))
    return out


def _hashed(items: list[str]) -> set[int]:
    return set(hash_strings(items).tolist())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(8))
def test_coverage_items_per_sketch_match_the_per_request_rule(
    layout: AggregateLayout, seed: int
) -> None:
    """Every window's top-K sketch of a (bucket, variant) holds the top K items of the
    requests whose deadline falls in the bucket, its users sketch their users; the
    catalogue, every item shown."""
    done = _finalised(seed, layout)
    update = coverage_updates(done, layout, _key)
    expected: dict[str, set[int]] = defaultdict(set)
    longest = max(layout.windows_ms)
    for request, deadline in zip(done.requests, done.deadline_ms.tolist(), strict=True):
        for window in layout.windows_ms:
            start = _start(window, deadline, layout)
            for k in layout.ks:
                key = _key(window, start, request.variant, k)
                expected[key] |= _hashed(list(request.items[:k]))
            expected[_key(window, start, request.variant, USERS)] |= _hashed([request.user_id])
        expected[_key(longest, _start(longest, deadline, layout), "*", 0)] |= _hashed(
            list(request.items)
        )
    got = _contents(update)
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in expected.items() if v}


@pytest.mark.parametrize("seed", range(4))
def test_coded_items_hash_as_their_ids(seed: int) -> None:
    """Items as codes of a codebook, hashed once per distinct string (grown between
    batches): the same sketch contents as the item ids themselves."""
    layout = LAYOUTS[0]
    done = _finalised(seed, layout)
    book = Codebook(f"p{n}" for n in range(40))  # some strings hashed before the rest
    book.hashes()
    items = done.due.items
    recoded = np.array([book.code(done.names[c]) for c in items.flat.tolist()], dtype=np.int64)
    coded = replace(
        done,
        due=replace(done.due, items=Ragged(recoded, items.off)),
        names=book.strings,
        name_hashes=book.hashes(),
    )
    assert len(book) > 40
    assert _contents(coverage_updates(coded, layout, _key)) == _contents(
        coverage_updates(done, layout, _key)
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_shown_item_is_placed_once_per_window_fed_by_items(layout: AggregateLayout) -> None:
    """Cut-offs nest and longer windows are unions: an item within max(K) is placed in
    registers once per window fed by items, one beyond it once (the catalogue)."""
    done = _finalised(3, layout)
    update = coverage_updates(done, layout, _key)
    direct = [w for w in layout.windows_ms if layout.sketch_source(w) is None]
    placed = sum(len(positions) for positions, _ in update.sketches.values())
    beyond = sum(max(0, len(r.items) - max(layout.ks)) for r in done.requests)
    assert placed == (update.hashes.size - beyond) * len(direct) + beyond


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(8))
def test_block_increments_match_per_request_sums(layout: AggregateLayout, seed: int) -> None:
    done = _finalised(seed, layout)
    rows = np.arange(len(done.requests), dtype=np.intp)[::2]  # a subset, as for one shard
    blocks, raw = block_increments(done, rows, layout)
    sums = np.frombuffer(raw, dtype="<f8").reshape(len(blocks), *layout.block_shape)
    got = {name: sums[i] for i, (name, *_) in enumerate(blocks)}
    expected: dict[str, np.ndarray] = {}
    for r in rows.tolist():
        request, deadline = done.requests[r], int(done.deadline_ms[r])
        for window in layout.windows_ms:
            name = f"{window}:{_start(window, deadline, layout)}:{request.variant}"
            block = expected.setdefault(name, np.zeros(layout.block_shape))
            local = int(done.user_bucket[r]) // layout.shards
            block[int(done.cohort[r]), local] += done.rows[r]
    assert sorted(got) == sorted(expected)
    for name, block in expected.items():
        np.testing.assert_allclose(got[name], block, rtol=1e-12)
    for name, start, ttl, window in blocks:
        assert name.startswith(f"{window}:{start}:")
        assert ttl == (2 * window) // 1000 + 3600
