"""Checkpoint writes, and one write in flight beside the work that follows it.

The live path's checkpoint waits on the store (Redis runs the checkpoint script)
for about an eighth of the evaluator's time. A :class:`WriteBehind` runs the
checkpoints of one poll on a thread while the next poll is fetched, decoded,
joined and finalised; the caller settles it (waits for it and reads its outcome)
before preparing the next checkpoints. So the checkpoints of one partition still
reach the store one after another, in order, and at most one poll's worth is
ever in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from evaluator.engine.checkpoint import Delta, Outcome, PartitionWrite
from evaluator.engine.owned import Owned
from evaluator.engine.partition import StepCounts
from evaluator.engine.ports import StateStore

T = TypeVar("T")


@dataclass(slots=True)
class Write:
    """A partition's checkpoint, taken from its engine and not yet written."""

    partition: int
    owned: Owned
    seq: int
    delta: Delta
    counts: StepCounts


@dataclass(slots=True)
class Written:
    """What became of a poll's checkpoints: each write's outcome, in order, and the
    exception that stopped them."""

    outcomes: list[tuple[Write, Outcome]] = field(default_factory=list)
    error: Exception | None = None
    failed: list[Write] = field(default_factory=list)
    """The writes of a call that raised (each may or may not have landed)."""


def write_all(store: StateStore, writes: list[Write]) -> Written:
    """Write a poll's checkpoints in as few exchanges as the store allows; when it
    raises, every one of them counts as failed (each may or may not have landed)."""
    written = Written()
    if not writes:
        return written
    try:
        outcomes = store.checkpoint_many(
            [PartitionWrite(w.partition, w.owned.epoch, w.seq, w.delta) for w in writes]
        )
    except Exception as exc:
        written.error, written.failed = exc, list(writes)
        return written
    written.outcomes = list(zip(writes, outcomes, strict=True))
    return written


class WriteBehind(Generic[T]):
    """Runs one job at a time on a daemon thread; :meth:`settle` waits for it."""

    def __init__(self, name: str = "write-behind") -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._result: T | None = None
        self._error: BaseException | None = None

    def submit(self, job: Callable[[], T]) -> None:
        """Start ``job``; the previous one must have been settled."""
        if self._thread is not None:
            raise RuntimeError("the previous job is not settled")
        self._result, self._error = None, None

        def run() -> None:
            try:
                self._result = job()
            except BaseException as exc:  # handed to whoever settles
                self._error = exc

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def settle(self) -> tuple[T | None, BaseException | None]:
        """Wait for the job in flight; its result, or the exception it raised (both
        None when nothing was in flight)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None, None
        thread.join()
        result, error = self._result, self._error
        self._result, self._error = None, None
        return result, error
