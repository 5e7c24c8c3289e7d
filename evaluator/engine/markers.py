"""Finalised markers of one partition: which requests were finalised, and which
interactions each one applied or counted late. Pure: no I/O.

A marker makes a redelivered impression a duplicate and an interaction naming a
finalised request late (or a duplicate, when it applied already). Markers live for
``finalised_ttl`` of data time, millions of them, so each costs only its deadline
(and the ids, when it has some). They are written as segments: ``g:<n>`` holds the
markers of the requests finalised between two checkpoints, ``m:`` the bound below
which markers have expired, and a marker changed after its segment was written (an
interaction counted late) gets an ``f:<request>`` field that overrides its row.

A marker counts while its deadline is at or after the bound. In memory it is
dropped with its segment, once every marker in that segment has expired, not one by
one (a heap entry each would cost more than the marker): until then an expired
marker stays and counts for nothing, exactly as in a state rebuilt from the
changelog, which loads only the markers that count.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Protocol

from evaluator.engine.records import encode


class Changelog(Protocol):
    """Where the markers record their changes: the partition's changelog."""

    def create(self, name: str, value: bytes) -> None: ...

    def delete(self, name: str) -> None: ...

    def set(self, name: str, value: bytes | None) -> None: ...


@dataclass(slots=True)
class Markers:
    """The finalised markers of one partition (see the module docstring)."""

    log: Changelog = field(repr=False, compare=False)
    """The partition's changelog (its state holds these markers: not compared)."""
    final: dict[str, int] = field(default_factory=dict)
    """Finalised request -> its deadline (counts only at or after :attr:`before_ms`)."""
    applied: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Finalised request -> sorted ids of the interactions applied or counted late (a
    tuple, not a set: most hold one or two ids); absent when none."""
    before_ms: int | None = None
    """Markers whose deadline is before this have expired (field ``m:``)."""
    marked: dict[str, None] = field(default_factory=dict)
    """Requests finalised since the last flush: their markers go in one segment."""
    segments: list[tuple[int, str]] = field(default_factory=list)
    """Heap of (largest deadline, field name) of the stored segments (``g:<n>``)."""
    members: dict[str, list[str]] = field(default_factory=dict)
    """Segment -> the requests whose markers it holds: dropped from memory with it."""
    next_segment: int = 0
    overridden: set[str] = field(default_factory=set)
    """Finalised requests whose marker is stored as its own ``f:`` field."""
    fielded: list[tuple[int, str]] = field(default_factory=list)
    """Heap of (deadline, request) of markers loaded from ``f:`` fields, outside any
    segment's members: each is dropped when it expires."""

    def deadline(self, rid: str) -> int | None:
        """The deadline of a request's marker, None when it has none or it expired."""
        deadline = self.final.get(rid)
        bound = self.before_ms
        if deadline is None or (bound is not None and deadline < bound):
            return None
        return deadline

    def add(self, rid: str, deadline: int, ids: tuple[str, ...]) -> None:
        """Mark a request final (it goes in the next flush's segment)."""
        self.final[rid] = deadline
        if ids:
            self.applied[rid] = ids
        elif self.applied:  # an expired marker of the same request may linger
            self.applied.pop(rid, None)
        self.marked[rid] = None

    def change(self, rid: str, deadline: int, ids: tuple[str, ...]) -> None:
        """Change a marker's ids (an interaction counted late); ``ids`` sorted. It stays
        in its segment's members (its expiry is the segment's)."""
        self.final[rid] = deadline
        self.applied[rid] = ids
        if rid in self.marked:  # its segment is not written yet
            return
        value = encode((deadline, ids))
        if rid in self.overridden:
            self.log.set("f:" + rid, value)
        else:  # a field of its own overrides the written segment's row
            self.overridden.add(rid)
            self.log.create("f:" + rid, value)

    def expire(self, before_ms: int) -> None:
        """Move the expiry bound to ``before_ms`` (never back): drop the segments whose
        markers have all expired, and the markers loaded from expired fields."""
        if self.before_ms is not None and before_ms <= self.before_ms:
            return
        self.before_ms = before_ms
        self.log.set("m:", encode(before_ms))
        fielded = self.fielded
        while fielded and fielded[0][0] < before_ms:
            self.drop(heapq.heappop(fielded)[1], before_ms)
        segments = self.segments
        while segments and segments[0][0] < before_ms:
            name = heapq.heappop(segments)[1]
            self.log.set(name, None)
            for rid in self.members.pop(name, ()):
                self.drop(rid, before_ms)

    def drop(self, rid: str, before_ms: int) -> None:
        """Forget a request's marker if it has expired (a newer marker of the same
        request, finalised again after the old one expired, stays)."""
        deadline = self.final.get(rid)
        if deadline is None or deadline >= before_ms:
            return
        del self.final[rid]
        self.applied.pop(rid, None)
        self.marked.pop(rid, None)
        if rid in self.overridden:
            self.overridden.discard(rid)
            self.log.delete("f:" + rid)

    def write(self, out: dict[str, bytes | None], rows: int) -> None:
        """The markers of the requests finalised since the last flush: one segment (or
        several of ``rows`` rows)."""
        final, applied = self.final, self.applied
        # a marker dropped before this flush left :attr:`marked` with it
        rids = list(self.marked)
        self.marked = {}
        for start in range(0, len(rids), rows):
            part = rids[start : start + rows]
            name = f"g:{self.next_segment}"
            self.next_segment += 1
            out[name] = encode([(rid, final[rid], applied.get(rid, ())) for rid in part])
            heapq.heappush(self.segments, (max(final[rid] for rid in part), name))
            self.members[name] = part

    def load(
        self,
        segments: list[tuple[str, list[list[Any]]]],
        fields: list[tuple[str, list[Any]]],
    ) -> None:
        """Rebuild from stored segments and ``f:`` fields (:attr:`before_ms` set first):
        the markers that have not expired; a field loaded expired is deleted."""
        before = -(2**62) if self.before_ms is None else self.before_ms
        final, applied = self.final, self.applied
        for rid, (d, ids) in fields:
            if d < before:  # expired while its segment still held live markers
                self.log.set("f:" + rid, None)
                continue
            final[rid] = d
            if ids:
                applied[rid] = tuple(ids)
            self.fielded.append((d, rid))
            self.overridden.add(rid)
        for name, rows in segments:
            kept = []
            for rid, d, ids in rows:
                if d < before or rid in self.overridden:
                    continue
                final[rid] = d
                if ids:
                    applied[rid] = tuple(ids)
                kept.append(rid)
            self.members[name] = kept
            self.segments.append((max(row[1] for row in rows), name))
            self.next_segment = max(self.next_segment, int(name[2:]) + 1)
        heapq.heapify(self.segments)
        heapq.heapify(self.fielded)
