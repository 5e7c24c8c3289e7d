"""The state-store port: what the live pipeline needs from durable state.

Two implementations honour it and pass the same contract tests
(``tests/test_store_contract.py``): :mod:`evaluator.stores.memory` (embedded,
for the demo and pure-logic tests) and :mod:`evaluator.stores.redis`.

Every write is idempotent, and :meth:`StateStore.commit` claims each request
atomically, so at-least-once delivery, crashes and racing instances never
count a request twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from evaluator.engine.checkpoint import Checkpoint, Delta, Outcome
from evaluator.events import ImpressionBatch, InteractionBatch
from evaluator.finalise import Finalised, OpenRequest, UserContext
from evaluator.windows import AggregateLayout

FloatArray = npt.NDArray[np.float64]


class DueRequest(NamedTuple):
    """An open request whose finalisation deadline has passed."""

    shard: int
    request_id: str


class PartitionProgress(NamedTuple):
    """Largest event time ingested from one partition, and when (wall clock, ms)."""

    max_event_ms: int
    updated_ms: int


@dataclass(slots=True)
class IngestCounts:
    """What ingestion did not store: repeats and events for already-final requests."""

    duplicates: int = 0
    late: int = 0


class StateStore(Protocol):
    """Durable state of the live pipeline."""

    layout: AggregateLayout

    def check_layout(self) -> None:
        """Refuse to run against state written with another aggregate layout."""
        ...

    def claim(self, partition: int) -> Checkpoint:
        """Become the partition's owner: bump its epoch (fencing every earlier owner)
        and return its stored state and offsets."""
        ...

    def checkpoint(self, partition: int, epoch: int, seq: int, delta: Delta) -> Outcome:
        """Write one batch's delta atomically, only if ``epoch`` still owns the
        partition and the stored copy is the one written by its ``seq``-th checkpoint
        (see :class:`~evaluator.engine.checkpoint.Outcome`)."""
        ...

    def frontier(self) -> int | None:
        """The readout's event time: the furthest any partition's readout time has got
        (its watermark capped at its data, see
        :attr:`~evaluator.engine.checkpoint.Delta.readout_ms`); None before any."""
        ...

    def ingest(
        self,
        impressions: ImpressionBatch,
        interactions: InteractionBatch,
        deadlines_ms: Sequence[int],
        loose_late_before_ms: int,
    ) -> IngestCounts:
        """Store new events idempotently.

        ``deadlines_ms`` gives each impression's finalisation time. Interactions
        naming an already-finalised request are late; request-less interactions
        older than ``loose_late_before_ms`` can no longer join an open request
        and are late too.
        """
        ...

    def prepare_ingest(
        self,
        impressions: ImpressionBatch,
        interactions: InteractionBatch,
        deadlines_ms: Sequence[int],
    ) -> object:
        """The CPU-bound half of :meth:`ingest` (encoding), with no I/O: the live loop
        prepares the next batch while the previous one is applied."""
        ...

    def apply_ingest(self, prepared: object, loose_late_before_ms: int) -> IngestCounts:
        """The I/O half of :meth:`ingest`: store a prepared batch."""
        ...

    def due(self, watermark_ms: int, limit: int) -> list[DueRequest]:
        """Open requests whose deadline is at or before the watermark."""
        ...

    def open_requests(self, watermark_ms: int) -> tuple[int, int]:
        """Open requests, and how many of them are due (deadline at or before the
        watermark): a growing due count means finalisation is falling behind."""
        ...

    def load(self, due: Sequence[DueRequest]) -> tuple[list[OpenRequest], dict[str, UserContext]]:
        """The due requests (those still open) and the context of their users."""
        ...

    def commit(self, finalised: Finalised, prune_loose_before_ms: int | None = None) -> int:
        """Atomically claim each request once and add its row to its window buckets.

        Request-less interactions of the same users older than
        ``prune_loose_before_ms`` can no longer join anything and may be dropped.
        Returns the number of requests applied (claimed by this call).
        """
        ...

    def blocks(
        self, window_ms: int, since_ms: int | None = None, until_ms: int | None = None
    ) -> dict[tuple[int, str], FloatArray]:
        """The buckets of a window starting in ``[since_ms, until_ms]``, summed over shards.

        Keys are ``(bucket_start_ms, variant)``; values ``(2, user_buckets, row_width)``.
        """
        ...

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        """Distinct recommended items over the given buckets of a window.

        Returns the count per ``(variant, k)`` (top-k items of finalised
        requests) and the catalog seen: every item shown by any variant over the
        longest window ending at the last bucket.
        Sketch-based stores return estimates.
        """
        ...

    def distinct_unions(
        self, window_ms: int, bucket_starts: Sequence[int], groups: Sequence[tuple[str, str, int]]
    ) -> list[float]:
        """For each ``(variant, other, k)``: distinct top-k items recommended by either."""
        ...

    def record_progress(self, progress: Mapping[str, PartitionProgress]) -> None:
        """Merge partition progress (the larger event time wins)."""
        ...

    def progress(self) -> dict[str, PartitionProgress]: ...

    def counters(self) -> dict[str, int]:
        """Exactly-once counters kept with the state (late, duplicates, finalised ...)."""
        ...

    def propensity_counts(self) -> dict[str, int]:
        """The propensity estimators' counters, summed over every committed request
        (see :mod:`evaluator.propensity_estimation`)."""
        ...

    def propensity_curve(self, bucket_ms: int, proposal: tuple[float, ...]) -> tuple[float, ...]:
        """The propensity curve of a window bucket: the first proposal stored for it
        wins, so every instance scores that bucket with the same curve."""
        ...

    def close(self) -> None: ...
