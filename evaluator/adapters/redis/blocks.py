"""Reading a window's aggregate blocks from Redis through the local
:class:`~evaluator.adapters.redis.block_cache.BlockCache`.

Used by :class:`evaluator.adapters.redis.store.RedisStore` with the client it was given (only
that module imports redis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evaluator.adapters.redis.block_cache import NO_LOWER_BOUND, BlockCache
from evaluator.adapters.redis.sketches import same_slot
from evaluator.engine.ports import FloatArray


def read_blocks(
    client: Any,
    cache: BlockCache,
    tag: Callable[[int], str],
    window_ms: int,
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> dict[tuple[int, str], FloatArray]:
    """Blocks of a window in a range (``tag``: a shard's key prefix).

    Every commit records the blocks it touched under a per-shard version
    (``mod:<window>``). The first read (or one reaching further back) lists the
    window's index; later reads fetch only blocks written since the previous
    read. The result is always current, and reading is cheap once warm.
    """
    lo = NO_LOWER_BOUND if since_ms is None else since_ms
    hi = 2**62 if until_ms is None else until_ms
    full = cache.needs_listing(window_ms, lo)
    shards = range(cache.layout.shards)
    pipe = client.pipeline(transaction=False)
    for shard in shards:
        if full:
            pipe.zrangebyscore(f"{tag(shard)}bi:{window_ms}", lo, "+inf")
        seen = cache.version(window_ms, shard)
        pipe.zrangebyscore(f"{tag(shard)}mod:{window_ms}", f"({seen}", "+inf", withscores=True)
    replies = iter(pipe.execute())
    wanted: list[tuple[int, list[str]]] = []
    for shard in shards:
        listed = [text(n) for n in next(replies)] if full else None
        changed = [(text(n), int(v)) for n, v in next(replies)]
        names = cache.refresh(window_ms, shard, lo, listed, changed)
        if names:
            wanted.append((shard, names))
    cache.listed(window_ms, lo)
    pipe = client.pipeline(transaction=False)
    for shard, names in wanted:  # one MGET per shard: a single slot each
        same_slot(pipe, "MGET", [f"{tag(shard)}b:{name}" for name in names])
    for (shard, names), raws in zip(wanted, pipe.execute(), strict=True):
        cache.put(window_ms, shard, names, raws)
    return cache.assemble(window_ms, lo, hi)


def text(value: bytes | str | None) -> str:
    """A reply as text ("" for a missing value)."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value
