"""Forwarding bounds: how far a partition may finalise while events are forwarded.

Producers that do not key by user put some events on the wrong partition; the owner
forwards them, through the repartition topic, to their user's partition. While that
can happen, a partition may only finalise up to the smallest *own* watermark over all
partitions: below it, every partition has forwarded what it holds. The bound read
from the store at wall clock r applies to a partition once its repartition input was
confirmed at its end after r (it has then consumed everything forwarded before r).
With producers keyed by user nothing is forwarded, and the partitions are independent
once ``FORWARDING_SPAN`` idle timeouts have passed without a forward. Pure: the
marks come in through a callable.

The marks are the store's (each partition's as of its last checkpoint) with this
process's own partitions as their engines have them now (:func:`fresher`). An
engine's own watermark moves in an apply whose forwards are acknowledged before
that apply returns, so the value in memory is as safe as the checkpointed one:
every event it has consumed below it and had to forward is in the repartition topic.
(A process that dies after another partition used its value leaves those forwards
to be sent again by the next owner: duplicates, which the receivers drop by event id.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from evaluator.engine.checkpoint import Marks

MARKS_EVERY_MS = 250
"""How often the partitions' own watermarks are read while events may be forwarded."""
FORWARDING_SPAN = 10
"""Forwarding counts as active for this many idle timeouts after the latest forward."""
BOUNDS_KEPT = 16
"""Recent bounds kept, so one read before the latest confirmation is always there."""
NO_LIMIT = -(2**62)
"""A limit that holds the watermark where it is."""


def fresher(stored: Mapping[int, Marks], local: Mapping[int, Marks]) -> dict[int, Marks]:
    """The stored marks, with each partition this process owns at the later of its
    stored and in-memory values (a value unknown in one is taken from the other)."""
    out = dict(stored)
    for p, mine in local.items():
        theirs = out.get(p, Marks(None, None))
        out[p] = Marks(
            _later(mine.own_ms, theirs.own_ms), _later(mine.forwarded_ms, theirs.forwarded_ms)
        )
    return out


def _later(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class ForwardingBounds:
    """The finalisation limit of each owned partition (see the module docstring)."""

    def __init__(self, read_marks: Callable[[], dict[int, Marks]], idle_timeout_ms: int) -> None:
        self.read_marks = read_marks
        self.idle_timeout_ms = idle_timeout_ms
        self._read_ms = -(2**62)
        self._started_ms: int | None = None
        self._bounds: list[tuple[int, int]] = []
        """The latest (wall clock of the store read, smallest own watermark) pairs while
        partitions may forward."""
        self._limit: dict[int, int] = {}

    def limits(
        self, owned: Collection[int], caught_up: Mapping[str, int], now: int
    ) -> dict[int, int]:
        """Each owned partition's limit (``NO_LIMIT``: hold), or none at all when no
        partition has forwarded for the whole span. ``caught_up``: inputs confirmed at
        their end, with the wall clock of the confirmation."""
        if now - self._read_ms >= MARKS_EVERY_MS:
            self._read(now)
        if not self._bounds:
            return {}
        for p in owned:
            confirmed = caught_up.get(f"repartition:{p}", -1)
            # the newest bound read before the repartition input was confirmed at its end
            usable = [bound for read_at, bound in self._bounds if read_at <= confirmed]
            if usable:
                self._limit[p] = max(self._limit.get(p, NO_LIMIT), usable[-1])
        return {p: self._limit.get(p, NO_LIMIT) for p in owned}

    def forget(self, partition: int) -> None:
        """A partition (re)loaded: its new engine resumes behind its repartition input,
        so the limit the earlier engine earned by consuming it does not hold; it is
        earned again once the input is confirmed at its end."""
        self._limit.pop(partition, None)

    def _read(self, now: int) -> None:
        """Read the partitions' marks: a new bound while forwarding may happen."""
        self._read_ms = now
        marks = self.read_marks()
        recent = now - self.idle_timeout_ms * FORWARDING_SPAN
        if self._started_ms is None:
            self._started_ms = now
        # bounded from the start (a first forward may be on its way) until no partition
        # has forwarded for the whole span
        young = self._started_ms >= recent
        forwarding = any(
            m.forwarded_ms is not None and m.forwarded_ms >= recent for m in marks.values()
        )
        if young or forwarding:
            owns = [m.own_ms for m in marks.values()]
            bound = min(o for o in owns if o is not None) if None not in owns else NO_LIMIT
            self._bounds.append((now, bound))
            del self._bounds[:-BOUNDS_KEPT]
        else:
            self._bounds, self._limit = [], {}
