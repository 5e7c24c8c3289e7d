"""Polled batches and process counters: what sources hand to the partition tasks, and
what the tasks count for /metrics (plain records, no I/O)."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from evaluator.core.events import InvalidEvent

Kind = Literal["impressions", "interactions", "repartition"]
"""The input a batch came from; ``repartition`` batches carry events of both kinds,
each payload tagged by its first byte (:data:`TAGS`)."""
TAGS: dict[bytes, Literal["impressions", "interactions"]] = {
    b"I": "impressions",
    b"X": "interactions",
}


@dataclass(frozen=True, slots=True)
class PartitionBatch:
    """Raw messages of one source partition, in offset order."""

    kind: Kind
    partition: str
    """Stable partition name, e.g. ``impressions:3``."""
    payloads: Sequence[bytes]
    offsets: Sequence[int] | None = None
    """Source offset of each payload (defaults to its index)."""

    def offset(self, index: int) -> int:
        return self.offsets[index] if self.offsets is not None else index


@dataclass(frozen=True, slots=True)
class Rejected:
    """An invalid message, with where it came from, for counting and dead-lettering."""

    kind: Kind
    partition: str
    offset: int
    payload: bytes
    event: InvalidEvent


LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class LatencyHistogram:
    """Cumulative-bucket histogram of batch processing time in seconds (Prometheus style)."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.total += seconds
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, cumulative count)`` pairs ending with ``+Inf``."""
        running, out = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


@dataclass(slots=True)
class PipelineStats:
    """Running process counters (exported as Prometheus counters)."""

    consumed: Counter[str] = field(default_factory=Counter)
    invalid: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    late: int = 0
    finalised: int = 0
    dead_lettered: int = 0
    repartitioned: int = 0
    """Events forwarded to their user's partition (the producer keyed them otherwise)."""
    store_errors: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
