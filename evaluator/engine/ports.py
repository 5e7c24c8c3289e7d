"""The engine's ports: the state store (a checkpoint store for partition owners, and
the aggregate store every reader sums) and the source (a consumer-group member).

Two implementations honour it and pass the same contract tests
(``tests/test_store_contract.py``): :mod:`evaluator.adapters.memory` (embedded,
for the demo and pure-logic tests) and :mod:`evaluator.adapters.redis.store`.

A partition's owner writes one atomic checkpoint per batch (its state delta,
offsets, event time, counters and aggregate increments), accepted only from the
partition's current owner epoch and only on top of that owner's previous
checkpoint; so crashes, redelivery and stale owners never lose or double count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from evaluator.core.regression import HistoryKey
from evaluator.core.windows import AggregateLayout
from evaluator.engine.batches import PartitionBatch, Rejected
from evaluator.engine.checkpoint import Checkpoint, Delta, Marks, Outcome, PartitionWrite
from evaluator.engine.routing import Forwarded

FloatArray = npt.NDArray[np.float64]


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

    def checkpoint_many(self, writes: Sequence[PartitionWrite]) -> list[Outcome]:
        """:meth:`checkpoint` of several partitions (a poll's), each atomic and fenced on
        its own, in as few exchanges with the store as it allows; each one's outcome,
        in order. Raises what the store raised: then any of them may or may not have
        been applied (each write is whole or absent)."""
        ...

    def frontier(self) -> int | None:
        """The readout's event time: the furthest any partition's readout time has got
        (its watermark capped at its data, see
        :attr:`~evaluator.engine.checkpoint.Delta.readout_ms`); None before any."""
        ...

    def marks(self) -> dict[int, Marks]:
        """Every partition's own watermark and latest forwarding (for partitions that
        receive forwarded events)."""
        ...

    def open_requests(self, watermark_ms: int) -> tuple[int, int]:
        """Open requests as of each partition's last checkpoint, and how many of them
        are due (none: a partition finalises what becomes due in the same checkpoint)."""
        ...

    def blocks(
        self, window_ms: int, since_ms: int | None = None, until_ms: int | None = None
    ) -> dict[tuple[int, str], FloatArray]:
        """The buckets of a window starting in ``[since_ms, until_ms]``, summed over shards.

        Keys are ``(bucket_start_ms, variant)``; values ``(2, user_buckets, row_width)``.
        """
        ...

    def history(self, since_ms: int) -> dict[HistoryKey, FloatArray]:
        """The regression detector's arrays (:mod:`evaluator.core.regression`) of hours
        from ``since_ms`` on, summed over partitions: (hour start, variant) -> array."""
        ...

    def experiment_blocks(self, experiment: str) -> dict[str, FloatArray]:
        """An experiment's cumulative statistics since its start, per variant, summed
        over shards: ``(2, user_buckets, row_width)`` each."""
        ...

    def exposures(self, experiment: str) -> dict[str, int]:
        """Distinct users exposed per variant of an experiment (each at their first
        exposure; exact)."""
        ...

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        """Distinct recommended items over the given buckets of a window.

        Returns the count per ``(variant, k)`` (top-k items of finalised
        requests; ``k`` = :data:`~evaluator.engine.commit_payload.USERS`: the distinct
        users with a finalised request) and the catalog seen: every item shown by any
        variant over the longest window ending at the last bucket.
        Sketch-based stores return estimates.
        """
        ...

    def distinct_unions(
        self, window_ms: int, bucket_starts: Sequence[int], groups: Sequence[tuple[str, str, int]]
    ) -> list[float]:
        """For each ``(variant, other, k)``: distinct top-k items recommended by either."""
        ...

    def counters(self) -> dict[str, int]:
        """Exactly-once counters kept with the state (late, duplicates, finalised ...)."""
        ...

    def propensity_counts(self) -> dict[str, int]:
        """The propensity estimators' counters, summed over every committed request
        (see :mod:`evaluator.core.propensity.estimation`)."""
        ...

    def propensity_curve(self, bucket_ms: int, proposal: tuple[float, ...]) -> tuple[float, ...]:
        """The propensity curve of a window bucket: the first proposal stored for it
        wins, so every instance scores that bucket with the same curve."""
        ...

    def ping(self) -> bool:
        """Whether the store answers (readiness); raises when it cannot be reached."""
        ...

    def close(self) -> None: ...


class Source(Protocol):
    """A consumer-group member feeding the engine (kafka-python or confluent-kafka).

    Batches come per (kind, partition number); offsets are committed only after the
    state they lead to is durable, and a new owner resumes from the store's checkpoint
    (given back through the ``on_claim`` callback each adapter takes). Both adapters
    pass ``tests/test_source_contract.py`` and the live suite."""

    session_timeout_s: float
    """How long the group waits for a silent member (the loop rejoins after twice that)."""
    dead_letters: bool
    """Whether invalid events are copied to a dead-letter topic."""
    awaiting_since: float | None
    """When a rebalance started without an assignment yet (monotonic s); None: settled."""

    def partition_count(self) -> int:
        """The input topics' common partition count (creating missing internal topics);
        a ConfigError when they differ."""
        ...

    def subscribe(self) -> None:
        """(Re)join the group."""
        ...

    def poll(self, wait_ms: int | None = None) -> list[PartitionBatch]:
        """One poll's messages, grouped by input partition; it waits up to ``wait_ms``
        for records (None, or less than ``kafka.poll_timeout``: that long), and returns
        as soon as some arrive."""
        ...

    def caught_up(self) -> dict[str, int]:
        """Assigned inputs consumed to their end, with the wall clock (ms) of the broker's
        answer that confirmed it."""
        ...

    def refresh_ends(self) -> None:
        """Ask the broker for the assigned partitions' end offsets (raises on no answer)."""
        ...

    def lag(self) -> dict[str, int]:
        """Messages behind the end per assigned input partition."""
        ...

    def assigned_numbers(self) -> set[int]: ...

    def pause(self, numbers: Sequence[int]) -> None:
        """Stop fetching partitions lost to a newer owner (until the next assignment)."""
        ...

    def seek(self, resume: dict[int, dict[str, int]]) -> None:
        """Move partitions back to their checkpointed offsets (per kind)."""
        ...

    def commit_offsets(self, offsets: dict[int, dict[str, int]]) -> None:
        """Commit checkpointed offsets to Kafka (monitoring; the store is authoritative)."""
        ...

    def forward(self, forwarded: Sequence[Forwarded]) -> list[Forwarded]:
        """Send events to their user's partition, durably; returns those refused as too large."""
        ...

    def dead_letter(self, rejected: Sequence[Rejected]) -> None:
        """Copy invalid messages to their dead-letter topic, durably."""
        ...

    def close(self) -> None: ...
