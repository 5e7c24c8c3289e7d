"""Event-time progress of a partition's inputs: which are busy, and how far they got.

Each input (a topic partition) delivers events in roughly increasing event time, at
its own rate: while a backlog is consumed, one topic can run hours of event time
ahead of the other. Two readings follow from the inputs' progress:

* the **watermark** (see :meth:`~evaluator.engine.partition.PartitionEngine.advance`)
  is the smallest event time over the busy inputs, or the wall clock once all are idle;
* the **settled time** (:class:`Settled`) is the same smallest time without the wall
  clock: what every input has delivered up to. Whatever expires by the data's own
  time (markers, interactions waiting for a request that never came, ended
  experiments) follows it, so a leading topic cannot expire what the lagging one
  still has to deliver, and an idle partition does not expire by the wall clock.

Pure: the wall clock comes in as an argument.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(slots=True)
class InputClock:
    """Event-time progress of one input (a topic partition) of the engine."""

    max_event_ms: int | None = None
    caught_up_since_ms: int | None = None
    """Wall clock of the first broker confirmation that its owner is at the end offset
    with nothing new since; None: behind, or it delivered records in the last poll."""
    confirmed_ms: int | None = None
    """Wall clock of the latest such confirmation: the input is idle once the
    confirmations span ``idle_timeout`` (an unreachable broker confirms nothing, so an
    outage never makes an input idle)."""

    def busy(self, idle_ms: int) -> bool:
        """Whether it may still deliver events (not confirmed at its end for ``idle_ms``)."""
        since, last = self.caught_up_since_ms, self.confirmed_ms
        return since is None or last is None or last - since < idle_ms


def progress(
    inputs: Mapping[str, InputClock], idle_ms: int, eager: Collection[str]
) -> tuple[dict[str, int | None], list[int]]:
    """Each busy input's largest event time (None: nothing delivered yet), and every
    input's that has one. An ``eager`` input is idle as soon as it is at its end."""
    busy = {n: c.max_event_ms for n, c in inputs.items() if c.busy(0 if n in eager else idle_ms)}
    return busy, [c.max_event_ms for c in inputs.values() if c.max_event_ms is not None]


class Settled:
    """The event time every input has delivered up to; never moves back.

    ``first``: the input every other one waits for (the impressions: an interaction
    can wait for its request, not the reverse). Until it has delivered, nothing is
    settled; an input that has delivered nothing else holds nothing back."""

    def __init__(self, first: str) -> None:
        self.first = first
        self.ms: int | None = None

    def update(self, busy: Mapping[str, int | None], seen: list[int]) -> int | None:
        """Move to the smallest time over the busy inputs that have one (the largest of
        all once every input is idle)."""
        if self.first in busy and busy[self.first] is None:
            return self.ms
        known = [t for t in busy.values() if t is not None]
        candidate = min(known) if known else max(seen, default=None)
        if candidate is not None and (self.ms is None or candidate > self.ms):
            self.ms = candidate
        return self.ms
