"""Coverage sketches in Redis: HyperLogLogs of the items shown, per window bucket,
variant and cut-off (written at each commit, counted when metrics are read).

Used by :class:`evaluator.stores.redis.RedisStore` through the client it was given;
only that module imports redis. All sketches share one hash tag, so the multi-key
PFCOUNT and PFMERGE calls stay on one slot of a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from evaluator.finalise import Finalised
from evaluator.stores.commit_payload import coverage_updates
from evaluator.windows import AggregateLayout

PFADD_CHUNK = 10_000
"""Items per PFADD command."""
EMPTY_DENSE_HLL = b"HYLL" + bytes(4) + bytes(8) + bytes(12_288)
"""An empty HyperLogLog in Redis' dense encoding: magic, encoding 0 (dense), 3 unused
bytes, a valid cached cardinality of 0, and 16,384 six-bit registers at zero."""
DENSE_FROM = 1_000
"""A sketch getting at least this many items in one commit is created dense. Redis
starts every sketch sparse and converts it past ~3,000 bytes, and adding to the sparse
encoding costs about 5x more per item (measured: 1.05 against 0.21 µs); a sketch this
large would be converted soon anyway, so nothing is spent on small ones."""


class CoverageSketches:
    """The coverage sketches of one key prefix."""

    def __init__(
        self,
        client: Any,
        layout: AggregateLayout,
        prefix: str,
        ttl_s: int,
        execute: Callable[[Any], list[Any]],
    ) -> None:
        self.client = client
        self.layout = layout
        self.prefix = prefix
        self.ttl_s = ttl_s
        """Lifetime of a sketch after its last write (the longest block lifetime)."""
        self._execute = execute

    def key(self, window: int, start: int, variant: str, k: int) -> str:
        return f"{{{self.prefix}:cov}}:{window}:{start}:{variant}:{k}"

    def add(self, finalised: Finalised) -> None:
        """One pipelined PFADD per sketch, then the merges of :func:`coverage_updates`.
        Plain commands: PFADD and PFMERGE are idempotent (and so is creating a large
        sketch dense, SET NX), so a retry after a partial failure is harmless and no
        script is needed."""
        gathered, merges = coverage_updates(finalised, self.layout, self.key)
        if not gathered and not merges:
            return
        ttl = self.ttl_s
        pipe = self.client.pipeline(transaction=False)
        for key, items in gathered.items():
            members = list(items)
            if len(members) >= DENSE_FROM:
                pipe.set(key, EMPTY_DENSE_HLL, nx=True, ex=ttl)
            for i in range(0, len(members), PFADD_CHUNK):
                pipe.execute_command("PFADD", key, *members[i : i + PFADD_CHUNK])
            pipe.expire(key, ttl)
        for i in range(0, len(merges), 2):
            same_slot(pipe, "PFMERGE", merges[i : i + 2])
            pipe.expire(merges[i], ttl)
        self._execute(pipe)

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        pipe = self.client.pipeline(transaction=False)
        wanted = [(v, k) for v in variants for k in self.layout.ks]
        for variant, k in wanted:
            same_slot(pipe, "PFCOUNT", [self.key(window_ms, b, variant, k) for b in bucket_starts])
        same_slot(pipe, "PFCOUNT", self._catalog_keys(bucket_starts[-1] if bucket_starts else 0))
        replies = [float(n) for n in pipe.execute()]
        return dict(zip(wanted, replies[:-1], strict=True)), replies[-1]

    def distinct_unions(
        self, window_ms: int, bucket_starts: Sequence[int], groups: Sequence[tuple[str, str, int]]
    ) -> list[float]:
        if not bucket_starts:
            return [0.0] * len(groups)
        pipe = self.client.pipeline(transaction=False)
        for a, b, k in groups:
            keys = [self.key(window_ms, s, v, k) for s in bucket_starts for v in (a, b)]
            same_slot(pipe, "PFCOUNT", keys)
        return [float(n) for n in pipe.execute()]

    def _catalog_keys(self, until_ms: int) -> list[str]:
        """Sketches of every shown item over the longest window ending at ``until_ms``."""
        window = max(self.layout.windows_ms)
        width = self.layout.bucket_width(window)
        last = until_ms - until_ms % width
        first = last - window
        return [self.key(window, b, "*", 0) for b in range(first, last + 1, width)]


def same_slot(pipe: Any, command: str, keys: Sequence[str]) -> None:
    """Queue a multi-key command whose keys share one hash tag. redis-py's Cluster
    pipelines refuse the ``mget``/``pfcount`` helpers for several keys, but the raw
    command is routed to the keys' slot like any other."""
    pipe.execute_command(command, *keys)
