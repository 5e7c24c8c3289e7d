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
from typing import Literal, cast

Partitioner = Literal["murmur2", "crc32", "trust"]
CACHE_LIMIT = 1_000_000
"""Users whose partition is remembered (cleared when full): users come back often."""

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
        out: list[int | None] = list(map(known.get, user_ids))
        if None not in out:  # every user seen lately: the common case
            return cast(list[int], out)
        for i, uid in enumerate(user_ids):
            if out[i] is None:
                if len(known) >= CACHE_LIMIT:
                    known.clear()
                p = known.get(uid)
                out[i] = known[uid] = function(uid.encode(), n) if p is None else p
        return cast(list[int], out)
