"""Finalised markers of one partition: which requests were finalised, which
interactions each one applied or counted late, and which request-less interactions
were taken or pruned. Pure: no I/O.

A marker makes a redelivered impression a duplicate and an interaction naming a
finalised request late (or a duplicate, when its event id was applied already).
Markers live for ``finalised_ttl`` of data time, millions of them, so none is an
object or keeps an id: a marker is the 64-bit hash of its request id and its
deadline, and each interaction it applied or counted late is the 64-bit hash of its
event id, with the request's deadline. A request-less ("loose") interaction that a
finalised request took, that expired unjoined or that came late is the same hash of
its event id, with its own time for a deadline (:meth:`Markers.add_seen`). A
redelivery is then a duplicate, and so is another event reusing the id, whichever
request or user it names, as in replay. (Versions before 2026-12-08 hashed an
applied interaction as (request, event, deadline): read, by :func:`Markers.pair_keys`,
until they expire.) The hashes are keyed with the partition's own
random seed (field ``k:``; the event ids' with the seed xor :data:`SEEN_SALT`, so
the two kinds of hash are independent),
so nobody can choose ids that collide; by chance two of 10 million live ids collide
with a probability of about 1 in 370,000, and such a collision counts one new
request (or one new interaction) as a duplicate.

In memory the hashes and their deadlines are :class:`~evaluator.engine.hashruns.HashRuns`:
sorted runs in three levels, looked up a batch at a time at a cost that does not grow
with the markers held. In the changelog, ``g:<n>`` holds those added between two
checkpoints (hash bytes and deadline offsets), ``m:`` the bound below which markers
have expired. A marker counts while its deadline is at or after the bound. A segment
is deleted, and a run dropped from memory, once everything in it has expired (a
merge also drops the expired entries it copies); until then an expired marker stays
and counts for nothing, exactly as in a state rebuilt from the changelog. Versions
before hashed markers wrote rows of ids in ``g:`` and ``f:<request>`` overrides: they
are read (hashed on load) and deleted as they expire, as are the ``x:<event>`` fields
(one per loose interaction, its time) that versions before 2026-12-07 wrote.
"""

from __future__ import annotations

import heapq
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from evaluator.core.sketch import hash_strings
from evaluator.engine.hashruns import NONE_MS, HashRuns
from evaluator.engine.records import encode

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

MARKER_FORMAT = 2
"""The version of a ``g:`` segment's layout (its first element; older ones are rows)."""
EARLIEST_MS = -(2**62)
SEEN_SALT = 0x9E37_79B9_7F4A_7C15
"""Xored into the seed for the hashes of loose interactions' event ids."""


class Changelog(Protocol):
    """Where the markers record their changes: the partition's changelog."""

    def set(self, name: str, value: bytes | None) -> None: ...


@dataclass(slots=True)
class Pending:
    """Hashes and deadlines added since the last flush (the next segment's)."""

    keys: list[U64] = field(default_factory=list)
    deadlines: list[I64] = field(default_factory=list)

    def add(self, keys: U64, deadlines: I64) -> None:
        if keys.size:
            self.keys.append(keys)
            self.deadlines.append(deadlines)

    def take(self) -> tuple[U64, I64]:
        keys = np.concatenate(self.keys) if self.keys else np.zeros(0, np.uint64)
        deadlines = np.concatenate(self.deadlines) if self.deadlines else np.zeros(0, np.int64)
        self.keys, self.deadlines = [], []
        return keys, deadlines

    def __len__(self) -> int:
        return sum(k.size for k in self.keys)


def _new_seed() -> int:
    return secrets.randbits(64)


@dataclass(slots=True, eq=False)
class Markers:
    """The finalised markers of one partition (see the module docstring)."""

    log: Changelog = field(repr=False)
    seed: int = field(default_factory=_new_seed)
    """Keys every hash (field ``k:``, written with the first segment)."""
    seed_written: bool = False
    final: HashRuns = field(default_factory=HashRuns)
    """Finalised requests' hashes -> their deadlines."""
    applied: HashRuns = field(default_factory=HashRuns)
    """Hashes of the event ids of the interactions applied or counted late, with their
    requests' deadlines, and of request-less interactions taken, expired or late, with
    their own times (and older versions' (request, event, deadline) hashes)."""
    before_ms: int | None = None
    """Markers whose deadline is before this have expired (field ``m:``)."""
    new_final: Pending = field(default_factory=Pending)
    new_applied: Pending = field(default_factory=Pending)
    segments: list[tuple[int, str]] = field(default_factory=list)
    """Heap of (largest deadline, field name) of the stored segments (``g:<n>``, and
    the ``f:<request>`` and ``x:<event>`` fields of older versions)."""
    next_segment: int = 0

    @property
    def bound(self) -> int:
        return EARLIEST_MS if self.before_ms is None else self.before_ms

    def keys(self, rids: Sequence[str]) -> U64:
        return hash_strings(rids, self.seed)

    def pair_keys(self, rids: Sequence[str], eids: Sequence[str], deadlines: Sequence[int]) -> U64:
        """Hashes of (request, event, deadline): how versions before 2026-12-08 marked
        an interaction applied or counted late (read until they expire)."""
        joined = [f"{r}\x1f{e}\x1f{d}" for r, e, d in zip(rids, eids, deadlines, strict=True)]
        return hash_strings(joined, self.seed)

    def seen_keys(self, eids: Sequence[str]) -> U64:
        return hash_strings(eids, self.seed ^ SEEN_SALT)

    def were_seen(self, eids: Sequence[str]) -> list[bool]:
        """Whether each interaction's event id has a marker that counts: applied,
        counted late, or request-less and taken, expired or late."""
        if not eids or not len(self.applied):
            return [False] * len(eids)
        return (self.applied.find(self.seen_keys(eids)) >= self.bound).tolist()  # type: ignore[no-any-return]

    def add_seen(self, eids: Sequence[str], times_ms: Sequence[int]) -> None:
        """Mark loose interactions taken, expired or late (until their own time is
        past the bound): in the next flush's segment, with the applied ones."""
        times = np.array(times_ms, dtype=np.int64)
        live = times >= self.bound  # one already expired would count for nothing, even
        if live.any():  # written (a redelivery of it is late again, as after the TTL)
            kept = [eid for eid, keep in zip(eids, live.tolist(), strict=True) if keep]
            self.add_applied(self.seen_keys(kept), times[live])

    def deadlines(self, rids: Sequence[str]) -> list[int | None]:
        """The deadline of each request's marker, None when it has none that counts."""
        found = self.final.find(self.keys(rids))
        bound = self.bound
        return [d if d >= bound else None for d in found.tolist()]

    def finalised(self, rids: Sequence[str]) -> list[bool]:
        """Whether each request has a marker that counts."""
        if not rids:
            return []
        return (self.final.find(self.keys(rids)) >= self.bound).tolist()  # type: ignore[no-any-return]

    def were_applied(self, keys: U64) -> list[bool]:
        """Whether each (request, event, deadline) hash was applied or counted late (the
        hashes versions before 2026-12-08 wrote: :func:`pair_keys`)."""
        return (self.applied.find(keys) >= self.bound).tolist()  # type: ignore[no-any-return]

    def add(
        self,
        rids: Sequence[str],
        deadlines: Sequence[int],
        applied: Sequence[tuple[str, int]] = (),
    ) -> None:
        """Mark requests final, with the (event id, request's deadline) of the
        interactions they applied; all go in the next flush's segment."""
        if rids:
            keys = self.keys(rids)
            times = np.array(deadlines, dtype=np.int64)
            self.final.add(keys, times, self.bound)
            self.new_final.add(keys, times)
        if applied:
            es, ds = zip(*applied, strict=True)
            self.add_applied(self.seen_keys(es), np.array(ds, dtype=np.int64))

    def add_applied(self, keys: U64, deadlines: I64) -> None:
        """Interactions counted late (their hashes, their markers' deadlines), or
        request-less ones marked (:meth:`add_seen`)."""
        self.applied.add(keys, deadlines, self.bound)
        self.new_applied.add(keys, deadlines)

    def pending(self) -> int:
        return len(self.new_final) + len(self.new_applied)

    def expire(self, before_ms: int) -> None:
        """Move the expiry bound to ``before_ms`` (never back): drop the runs and
        delete the segments whose markers have all expired."""
        if self.before_ms is not None and before_ms <= self.before_ms:
            return
        self.before_ms = before_ms
        self.log.set("m:", encode(before_ms))
        self.final.expire(before_ms)
        self.applied.expire(before_ms)
        segments = self.segments
        while segments and segments[0][0] < before_ms:
            self.log.set(heapq.heappop(segments)[1], None)

    def write(self, out: dict[str, bytes | None], rows: int) -> None:
        """What was added since the last flush: segments of at most ``rows`` hashes
        each (the seed with the first)."""
        if not self.pending():
            return
        self.write_seed(out)
        keys, deadlines = self.new_final.take()
        pairs, pair_deadlines = self.new_applied.take()
        for start in range(0, max(keys.size, pairs.size), rows):
            part = slice(start, start + rows)
            name = f"g:{self.next_segment}"
            self.next_segment += 1
            segment = (keys[part], deadlines[part], pairs[part], pair_deadlines[part])
            out[name] = encode_segment(*segment)
            heapq.heappush(self.segments, (_last(segment), name))

    def write_seed(self, out: dict[str, bytes | None]) -> None:
        """The seed (``k:``), unless written already: before any hash it keys is."""
        if not self.seed_written:
            out["k:"] = encode(self.seed)
            self.seed_written = True

    def load(
        self,
        segments: list[tuple[str, Any]],
        fields: list[tuple[str, list[Any]]],
        seen: Sequence[tuple[str, int]] = (),
    ) -> None:
        """Rebuild from stored segments (and older versions' ``f:`` fields and ``x:``
        fields, ``seen``: event id and time), with :attr:`before_ms` and the seed they
        were hashed with (``k:``) set first (no seed stored: the markers are all rows of
        ids); expired fields are deleted."""
        parts: list[tuple[U64, I64, U64, I64]] = []
        for name, value in segments:
            part = decode_segment(value) if value and isinstance(value[0], int) else None
            if part is None:  # rows of ids
                part = self._hashed([(rid, d, ids) for rid, d, ids in value])
            parts.append(part)
            self.segments.append((_last(part), name))
            self.next_segment = max(self.next_segment, int(name[2:]) + 1)
        for rid, (d, ids) in fields:
            if d < self.bound:  # expired while its segment still held live markers
                self.log.set("f:" + rid, None)
                continue
            parts.append(self._hashed([(rid, d, ids)]))
            self.segments.append((d, "f:" + rid))
        parts += self._load_seen(seen)
        heapq.heapify(self.segments)
        if parts:
            keys, deadlines, pairs, pair_deadlines = (
                np.concatenate([p[i] for p in parts]) for i in range(4)
            )
            self.final.add(keys, deadlines, self.bound)
            self.applied.add(pairs, pair_deadlines, self.bound)

    def _load_seen(self, seen: Sequence[tuple[str, int]]) -> list[tuple[U64, I64, U64, I64]]:
        """Older versions' ``x:`` fields as hashes (each field deleted once its time
        has expired: at once when loaded expired)."""
        live = [(eid, t) for eid, t in seen if t >= self.bound]
        for eid, t in seen:
            if t < self.bound:
                self.log.set("x:" + eid, None)
        if not live:
            return []
        self.segments += [(t, "x:" + eid) for eid, t in live]
        none = np.zeros(0, dtype=np.uint64)
        times = np.array([t for _, t in live], dtype=np.int64)
        return [(none, none.view(np.int64), self.seen_keys([eid for eid, _ in live]), times)]

    def _hashed(self, rows: list[tuple[str, int, list[str]]]) -> tuple[U64, I64, U64, I64]:
        """Rows of ids (request, deadline, event ids) as hashes (the applied events'
        as this version writes them)."""
        applied = [(eid, d) for _, d, ids in rows for eid in ids]
        return (
            self.keys([rid for rid, _, _ in rows]),
            np.array([d for _, d, _ in rows], dtype=np.int64),
            self.seen_keys([eid for eid, _ in applied]),
            np.array([d for _, d in applied], dtype=np.int64),
        )

    def live(self) -> tuple[dict[int, int], set[int]]:
        """The markers that count (hash -> deadline) and the applied hashes that count:
        what a state rebuilt from the changelog must equal."""
        return self.final.live(self.bound), set(self.applied.live(self.bound))

    def __len__(self) -> int:
        """Markers held (expired ones included until their run goes)."""
        return len(self.final)

    @property
    def nbytes(self) -> int:
        return self.final.nbytes + self.applied.nbytes


def _last(segment: tuple[U64, I64, U64, I64]) -> int:
    """The largest deadline of a segment's hashes."""
    return max(int(segment[1].max(initial=NONE_MS)), int(segment[3].max(initial=NONE_MS)))


def _offsets(deadlines: I64, base: int) -> tuple[str, bytes]:
    span = int(deadlines.max(initial=base)) - base
    dtype = np.dtype("<u4") if span < 2**32 else np.dtype("<i8")
    return dtype.str, (deadlines - base).astype(dtype).tobytes()


def encode_segment(keys: U64, deadlines: I64, pairs: U64, pair_deadlines: I64) -> bytes:
    """A ``g:`` segment: the hashes' bytes and each deadline as an offset from the
    smallest (4 bytes where they span under 49 days)."""
    base = int(min(deadlines.min(initial=2**62), pair_deadlines.min(initial=2**62)))
    return encode(
        [
            MARKER_FORMAT,
            base,
            keys.astype("<u8").tobytes(),
            *_offsets(deadlines, base),
            pairs.astype("<u8").tobytes(),
            *_offsets(pair_deadlines, base),
        ]
    )


def decode_segment(value: list[Any]) -> tuple[U64, I64, U64, I64]:
    """The hashes and deadlines of an encoded segment (its decoded msgpack list)."""
    version, base, keys, dtype, offsets, pairs, pair_dtype, pair_offsets = value
    if version != MARKER_FORMAT:
        raise ValueError(f"marker segment of format {version}, not {MARKER_FORMAT}")

    def times(dtype: str, raw: bytes) -> I64:
        offsets: I64 = np.frombuffer(raw, dtype=np.dtype(dtype)).astype(np.int64)
        return offsets + int(base)

    return (
        np.frombuffer(keys, dtype="<u8").astype(np.uint64),
        times(dtype, offsets),
        np.frombuffer(pairs, dtype="<u8").astype(np.uint64),
        times(pair_dtype, pair_offsets),
    )
