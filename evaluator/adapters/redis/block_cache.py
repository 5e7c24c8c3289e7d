"""A local copy of the window blocks a state store holds, refreshed incrementally.

Pure bookkeeping, no I/O: the Redis store lists which blocks exist and which
changed (each commit records the blocks it touched under a per-shard version),
fetches only those, and hands the bytes over. The cache keeps one assembled
``(2 cohorts, user buckets, row)`` array per (bucket start, variant), so reading
a window is cheap once warm.
"""

from __future__ import annotations

import numpy as np

from evaluator.core.windows import AggregateLayout, stored_block
from evaluator.engine.ports import FloatArray

NO_LOWER_BOUND = -(2**62)


def block_start(name: str) -> int:
    """Bucket start of a block named ``<window ms>:<start ms>:<variant>``."""
    return int(name.split(":", 2)[1])


class BlockCache:
    """Blocks per (window, shard), and their assembly across shards."""

    def __init__(self, layout: AggregateLayout) -> None:
        self.layout = layout
        self._cache: dict[tuple[int, int], dict[str, FloatArray]] = {}
        self._versions: dict[tuple[int, int], int] = {}
        self._assembled: dict[int, dict[tuple[int, str], FloatArray]] = {}
        self._owners: dict[tuple[int, tuple[int, str]], set[int]] = {}
        self._listed_from: dict[int, int] = {}
        self._evicted_below: dict[tuple[int, int], int] = {}

    def needs_listing(self, window_ms: int, lo: int) -> bool:
        """Whether the window's block index must be listed (first read, or further back)."""
        listed = self._listed_from.get(window_ms)
        return listed is None or lo < listed

    def listed(self, window_ms: int, lo: int) -> None:
        self._listed_from[window_ms] = lo

    def version(self, window_ms: int, shard: int) -> int:
        """Newest commit version seen for the shard's blocks of this window."""
        return self._versions.get((window_ms, shard), 0)

    def refresh(
        self,
        window_ms: int,
        shard: int,
        lo: int,
        listed: list[str] | None,
        changed: list[tuple[str, int]],
    ) -> list[str]:
        """Update one shard's bookkeeping from a listing (or None) and the blocks changed
        since :meth:`version`; returns the block names to fetch."""
        key = (window_ms, shard)
        cache = self._cache.setdefault(key, {})
        fetch = [] if listed is None else [n for n in listed if n not in cache]
        for name, version in changed:
            if cache.pop(name, None) is not None:
                self._place(window_ms, shard, name, None)
            fetch.append(name)
            self._versions[key] = max(self._versions.get(key, 0), version)
        if listed is not None:  # a fresh listing: nothing below lo was fetched
            self._evicted_below[key] = min(lo, self._evicted_below.get(key, lo))
        if lo > self._evicted_below.get(key, NO_LOWER_BOUND):
            for name in [n for n in cache if block_start(n) < lo]:
                del cache[name]
                self._place(window_ms, shard, name, None)
            self._evicted_below[key] = lo
        return [n for n in dict.fromkeys(fetch) if block_start(n) >= lo]

    def put(self, window_ms: int, shard: int, names: list[str], raws: list[bytes | None]) -> None:
        """Fetched block values (little-endian doubles); None: the block has expired."""
        cache = self._cache.setdefault((window_ms, shard), {})
        for name, raw in zip(names, raws, strict=True):
            if raw is not None:
                cache[name] = stored_block(raw, self.layout)
                self._place(window_ms, shard, name, cache[name])

    def _place(self, window_ms: int, shard: int, name: str, block: FloatArray | None) -> None:
        """Keep the assembled (2, user_buckets, row) array of each bucket up to date."""
        layout = self.layout
        _, start, variant = name.split(":", 2)
        key = (int(start), variant)
        assembled = self._assembled.setdefault(window_ms, {})
        owners = self._owners.setdefault((window_ms, key), set())
        if block is None:
            owners.discard(shard)
            if not owners:
                assembled.pop(key, None)
                del self._owners[(window_ms, key)]
                return
        else:
            owners.add(shard)
        if key not in assembled:
            assembled[key] = np.zeros((2, layout.user_buckets, layout.row_width))
        # user bucket = local * shards + shard
        assembled[key][:, shard :: layout.shards, :] = 0.0 if block is None else block

    def assemble(self, window_ms: int, lo: int, hi: int) -> dict[tuple[int, str], FloatArray]:
        """Assembled buckets starting in [lo, hi] (shared with the cache: read only)."""
        return {
            key: block
            for key, block in self._assembled.get(window_ms, {}).items()
            if lo <= key[0] <= hi
        }
