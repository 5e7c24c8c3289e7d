"""The state-store port: a checkpoint store for partition owners, and the aggregate
store every reader sums.

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

from evaluator.core.windows import AggregateLayout
from evaluator.engine.checkpoint import Checkpoint, Delta, Marks, Outcome

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

    def close(self) -> None: ...
