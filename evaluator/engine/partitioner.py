"""Which partition a producer puts a user's events in (pure).

The engine needs a user's impressions and interactions in one partition number.
Producers choose the partition from the key (the user id) with their client's
partitioner; ``kafka.partitioner`` names it so the evaluator can tell events on
the wrong partition (keyed by something else, or by nothing) and forward them:

- ``murmur2``: the Java client's and kafka-python's default
  (``toPositive(murmur2(key)) % partitions``);
- ``crc32``: librdkafka's default ``consistent_random`` (confluent-kafka and most
  non-JVM clients: ``crc32(key) % partitions``);
- ``trust``: producers are known to co-partition; nothing is checked.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from evaluator.core.sketch import byte_columns

Partitioner = Literal["murmur2", "crc32", "trust"]
CACHE_LIMIT = 1_000_000
"""Users whose partition is remembered (cleared when full): users come back often."""
VECTOR_MIN = 64
"""New users in one call from which murmur2 runs vectorised (numpy's fixed cost per
call is worth it): a cold cache, or a user base larger than the cache."""

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of a key, as a signed 32-bit int (seed 0x9747b28c)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _murmur2_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


U64 = npt.NDArray[np.uint64]
_M64 = np.uint64(_M)
_MASK64 = np.uint64(_MASK)


def _mix(h: U64, k: U64) -> U64:
    """One 4-byte block of :func:`murmur2`, for many keys (products of two 32-bit
    values fit in 64 bits)."""
    k = (k * _M64) & _MASK64
    k ^= k >> np.uint64(24)
    k = (k * _M64) & _MASK64
    return ((h * _M64) & _MASK64) ^ k


def murmur2_partitions(keys: Sequence[bytes], partitions: int) -> list[int]:
    """``toPositive(murmur2(key)) % partitions`` of many keys at once: :func:`murmur2`
    over numpy columns, keys grouped by length."""
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    out = np.empty(len(keys), dtype=np.uint64)
    for rows, b in byte_columns(b"".join(keys), lengths):  # every key's byte i: b[i]
        length = len(b)
        h = np.full(rows.size, (0x9747B28C ^ length) & _MASK, dtype=np.uint64)
        end = length - length % 4
        for i in range(0, end, 4):
            block = b[i] | b[i + 1] << np.uint64(8) | b[i + 2] << np.uint64(16)
            h = _mix(h, block | b[i + 3] << np.uint64(24))
        for j in range(length - 1, end - 1, -1):  # the tail, as murmur2 takes it
            h ^= b[j] << np.uint64(8 * (j - end))
        if length > end:
            h = (h * _M64) & _MASK64
        h ^= h >> np.uint64(13)
        h = (h * _M64) & _MASK64
        out[rows] = h ^ (h >> np.uint64(15))
    return ((out & np.uint64(0x7FFFFFFF)) % np.uint64(partitions)).tolist()  # type: ignore[no-any-return]


def _crc32_partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


class PartitionOf:
    """The partition of each user id under one partitioner (None for ``trust``)."""

    def __init__(self, name: Partitioner, partitions: int) -> None:
        self.partitions = partitions
        chosen: dict[str, Callable[[bytes, int], int]] = {
            "murmur2": _murmur2_partition,
            "crc32": _crc32_partition,
        }
        self.function = chosen.get(name)
        self._known: dict[str, int] = {}

    @property
    def checks(self) -> bool:
        return self.function is not None

    def __call__(self, user_ids: Sequence[str]) -> list[int]:
        known, function, n = self._known, self.function, self.partitions
        if function is None:
            raise ValueError("the trust partitioner checks nothing")
        out = list(map(known.get, user_ids))
        if None not in out:  # every user seen lately: the common case
            return out  # type: ignore[return-value]
        new = list(dict.fromkeys(u for u, p in zip(user_ids, out, strict=True) if p is None))
        keys = [u.encode() for u in new]
        if function is _murmur2_partition and len(new) >= VECTOR_MIN:
            found = murmur2_partitions(keys, n)
        else:
            found = [function(key, n) for key in keys]
        if len(known) + len(new) > CACHE_LIMIT:
            known.clear()
        fresh = dict(zip(new, found, strict=True))
        known.update(fresh)
        return [fresh[u] if p is None else p for u, p in zip(user_ids, out, strict=True)]
