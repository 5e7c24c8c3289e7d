"""The block cache's bookkeeping, without Redis (the store's reads are covered by the
contract and scrape tests)."""

import numpy as np

from evaluator.adapters.redis.block_cache import BlockCache
from evaluator.core.windows import AggregateLayout

LAYOUT = AggregateLayout(ks=(10,), windows_ms=(60_000,), user_buckets=4, shards=2)
W = 60_000


def raw(value: float) -> bytes:
    return np.full(LAYOUT.block_shape, value, dtype="<f8").tobytes()


def test_blocks_are_assembled_across_shards_and_refetched_when_changed() -> None:
    cache = BlockCache(LAYOUT)
    assert cache.needs_listing(W, 0)
    assert cache.refresh(W, 0, 0, ["60000:5000:A"], []) == ["60000:5000:A"]
    assert cache.refresh(W, 1, 0, [], [("60000:5000:A", 7)]) == ["60000:5000:A"]
    cache.listed(W, 0)
    assert not cache.needs_listing(W, 0) and cache.needs_listing(W, -1)
    assert (cache.version(W, 0), cache.version(W, 1)) == (0, 7)
    cache.put(W, 0, ["60000:5000:A"], [raw(1.0)])
    cache.put(W, 1, ["60000:5000:A"], [raw(2.0)])
    block = cache.assemble(W, 0, 10_000)[(5000, "A")]
    # user bucket = local * shards + shard: even buckets from shard 0, odd from shard 1
    assert block.shape == (2, 4, LAYOUT.row_width)
    assert (block[:, 0::2] == 1.0).all() and (block[:, 1::2] == 2.0).all()
    # a cached block is not fetched again unless it changed
    assert cache.refresh(W, 0, 0, None, []) == []
    assert cache.refresh(W, 0, 0, None, [("60000:5000:A", 9)]) == ["60000:5000:A"]
    assert (cache.assemble(W, 0, 10_000)[(5000, "A")][:, 0::2] == 0.0).all()  # until refetched


def test_blocks_before_the_range_are_evicted() -> None:
    cache = BlockCache(LAYOUT)
    names = ["60000:5000:A", "60000:65000:A"]
    assert cache.refresh(W, 0, 0, names, []) == names
    cache.put(W, 0, names, [raw(1.0), raw(3.0)])
    assert set(cache.assemble(W, 0, 10**6)) == {(5000, "A"), (65000, "A")}
    assert cache.refresh(W, 0, 60_000, None, []) == []
    assert set(cache.assemble(W, 0, 10**6)) == {(65000, "A")}
    cache.put(W, 0, ["60000:125000:A"], [None])  # expired before it was fetched
    assert set(cache.assemble(W, 0, 10**6)) == {(65000, "A")}
