"""Coverage sketches in Redis: HyperLogLogs of the items shown, per window bucket,
variant and cut-off (written at each commit, counted when metrics are read).

Used by :class:`evaluator.adapters.redis.store.RedisStore` through the client it was given;
only that module imports redis. All sketches share one hash tag, so the multi-key
PFCOUNT and PFMERGE calls stay on one slot of a Redis Cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluator.core.finalise import Finalised
from evaluator.core.sketch import U64, hash_strings
from evaluator.core.windows import AggregateLayout, block_ttl_s
from evaluator.engine.commit_payload import USERS, coverage_updates

DENSE_HEADER = b"HYLL" + bytes(4) + bytes(7) + b"\x80"
"""Redis' dense HyperLogLog header: magic, encoding 0 (dense), 3 unused bytes, and a
cached cardinality marked invalid (top bit of its last byte), so PFCOUNT computes it."""
_INDEX_MASK = np.uint64((1 << 14) - 1)
_SENTINEL = np.uint64(1 << 50)
SKETCH_TAG = "hcov"
"""Hash tag of the coverage sketches. Versions that PFADDed items (Redis' own hash) used
``cov``: new names, so no sketch mixes two hashes (an item would count twice), also
while two versions run side by side during a rolling upgrade."""
Receipt = tuple[str, str, str]
"""Where a partition's checkpoint finds that its sketch writes landed: (key, field, value)."""
TEMPORARY_MS = 60_000
"""Lifetime of a temporary sketch, should its deletion not run."""


def dense_hll(items: Collection[str]) -> bytes:
    """A HyperLogLog of ``items`` in Redis' dense encoding (16,384 six-bit registers,
    packed least significant bit first), built with numpy instead of one PFADD argument
    per item: what Redis would store, except that the items are hashed with
    :func:`evaluator.core.sketch.hash_strings` (stable across processes), so every sketch
    must be built this way."""
    index, rank = register_ranks(hash_strings(list(items)))
    return dense_encoding(registers_of([(index, rank)]))


def register_ranks(hashes: U64) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint8]]:
    """Each hash's register (its low 14 bits) and rank (1 + the trailing zeros of the
    bits above them, as Redis counts)."""
    rest = (hashes >> np.uint64(14)) | _SENTINEL
    lowest = rest & (~rest + np.uint64(1))  # a power of two: exact as a double
    rank = (np.log2(lowest.astype(np.float64)) + 1).astype(np.uint8)
    return (hashes & _INDEX_MASK).astype(np.intp), rank


def registers_of(
    parts: Sequence[tuple[npt.NDArray[np.intp], npt.NDArray[np.uint8]]],
) -> npt.NDArray[np.uint8]:
    """The 16,384 registers holding every (register, rank) of ``parts``."""
    registers = np.zeros(1 << 14, dtype=np.uint8)
    for index, rank in parts:
        np.maximum.at(registers, index, rank)
    return registers


def dense_encoding(registers: npt.NDArray[np.uint8]) -> bytes:
    """16,384 register values (0..63) as Redis' dense HyperLogLog string: every four
    six-bit registers fill three bytes, least significant bit first."""
    r = registers.astype(np.uint32).reshape(-1, 4)
    packed = r[:, 0] | (r[:, 1] << 6) | (r[:, 2] << 12) | (r[:, 3] << 18)
    return DENSE_HEADER + packed.astype("<u4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()


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
        """Lifetime of a sketch whose window is unknown (the longest block lifetime);
        the others live as long as their window's blocks (``block_ttl_s``: a 5-minute
        window's 25-second buckets do not pile up for two days)."""
        self._execute = execute
        self._token = uuid.uuid4().hex
        """Names this process's temporary sketches (other instances write theirs)."""

    def key(self, window: int, start: int, variant: str, k: int) -> str:
        return f"{{{self.prefix}:{SKETCH_TAG}}}:{window}:{start}:{variant}:{k}"

    def add(self, parts: Sequence[tuple[Sequence[Finalised], Receipt]]) -> list[bool]:
        """Write the coverage of several partitions' finalised batches (a poll's
        checkpoints): each touched sketch's part built in the process (every batch's
        shown items hashed once, unions as register maxima, over all the partitions),
        merged into the stored sketch with one ``PFMERGE``: idempotent, so a retry
        after a partial failure is harmless and no script is needed.

        Each partition's ``receipt`` (key, field, value) is set last, in the writer's
        partition: the checkpoint that follows requires it, so a checkpoint is never
        applied without its sketch writes (Redis restarted between the two from an
        AOF without the sketches: the checkpoint is refused as stale, and the reloaded
        owner finalises those requests again). Returns, per partition, whether its
        receipt was set (none when it added to no sketch)."""
        built: dict[str, npt.NDArray[np.uint8]] = {}
        lifetime: dict[str, int] = {}

        def named(window: int, start: int, variant: str, k: int) -> str:
            name = self.key(window, start, variant, k)
            lifetime[name] = block_ttl_s(window)
            return name

        touched = [self._build(finalised, named, built) for finalised, _ in parts]
        written = [(key, registers) for key, registers in built.items() if registers.any()]
        if not written:
            return [False] * len(parts)
        pipe = self.client.pipeline(transaction=False)
        for n, (key, registers) in enumerate(written):
            temporary = f"{{{self.prefix}:{SKETCH_TAG}}}:new:{self._token}:{n}"
            pipe.set(temporary, dense_encoding(registers), px=TEMPORARY_MS)
            same_slot(pipe, "PFMERGE", [key, temporary])
            pipe.delete(temporary)
            pipe.expire(key, lifetime.get(key, self.ttl_s))
        for mine, (_, (key, field, value)) in zip(touched, parts, strict=True):
            if mine:
                pipe.hset(key, field, value)
        self._execute(pipe)
        return touched

    def _build(
        self,
        finalised: Sequence[Finalised],
        named: Callable[[int, int, str, int], str],
        built: dict[str, npt.NDArray[np.uint8]],
    ) -> bool:
        """Add one partition's batches to the registers ``built`` per sketch; whether it
        set any register."""
        touched = False
        for done in finalised:
            update = coverage_updates(done, self.layout, named)
            index, rank = register_ranks(update.hashes)
            mine: dict[str, npt.NDArray[np.uint8]] = {}
            for key, (positions, held) in update.sketches.items():
                registers = registers_of([(index[positions], rank[positions])])
                for other in held:
                    np.maximum(registers, mine[other], out=registers)
                mine[key] = registers
            for key, registers in mine.items():
                touched = touched or bool(registers.any())
                if key in built:
                    np.maximum(built[key], registers, out=built[key])
                else:
                    built[key] = registers
        return touched

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        pipe = self.client.pipeline(transaction=False)
        wanted = [(v, k) for v in variants for k in (*self.layout.ks, USERS)]
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
