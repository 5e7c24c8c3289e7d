"""A partition's open requests as columns: codes and arrays, not an object each. Pure.

An open request is a row of a :class:`~evaluator.engine.chunks.Chunk`: codes of
the partition's codebook, ids as bytes, and hash-sorted indexes for lookups by
binary search. About a fifth of the memory of the objects it replaces (see
BENCHMARKS.md), and batch-friendly: a lookup of many ids is one search per chunk.

Rows appended are held as they came (:mod:`evaluator.engine.newest`) until read as
columns, then become one chunk (about once a checkpoint); chunks merge into larger
ones as :mod:`evaluator.engine.merges` schedules, so a chunk is a stretch of arrival
order, which is nearly deadline order. A finished row is only marked dead; a chunk
goes when all its rows have, and one mostly dead is rewritten with its live rows. A
scan by impression time (the due requests) reads only the chunks whose span of times
it overlaps.
:class:`~evaluator.core.finalise.OpenRequest` objects are made only for the requests
being finalised (or asked for).

Rows come in as the changelog's request rows (:data:`~evaluator.engine.chunks.Row`)
or as column segments read back. A hash found is checked against the stored id,
so a collision can neither join the wrong request nor hide the right one.

The codebook only grows while the catalog holds still; past :data:`RECODE_AT`
entries, when most of them are no longer in use, it is rebuilt from the codes of
the open requests (every code changes, and the changelog is rewritten:
:func:`evaluator.engine.request_log.rewrite`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from evaluator.core.due import Due, OpenRequest, Ragged, time_order
from evaluator.core.tokens import Spans
from evaluator.engine import merges
from evaluator.engine.chunks import I64, Chunk, Row, hashes_of, span_codes
from evaluator.engine.codebook import NONE, Codebook
from evaluator.engine.newest import Newest

RECODE_AT = 1 << 19
"""Codebook entries before the codes of live rows are counted and the book rebuilt
(when it holds four times as many as are in use): a churning catalog stays bounded."""

NEVER = -(2**62)
"""A time before every impression."""

Location = tuple[Chunk, int]
Places = list[tuple[Chunk, I64]]
"""Rows of chunks (where :meth:`OpenTable.due` found the requests it returned)."""


class Shown(NamedTuple):
    """Open requests as columns: user, impression time, request id, item codes."""

    user: list[str]
    ms: I64
    request: list[str]
    items: Ragged


class OpenTable:
    """The open requests of one partition, by request id (see the module docstring)."""

    def __init__(self, book: Codebook | None = None) -> None:
        self.book = book or Codebook()
        self._chunks: list[Chunk] = []
        self._newest = Newest()
        """Rows appended and not yet a chunk (:mod:`evaluator.engine.newest`)."""
        self._built: list[Chunk] = []
        self._live = 0
        self._recode_at = RECODE_AT
        self.recoded = False
        """Set when the codebook was rebuilt (codes changed): the changelog's segments
        must be rewritten (the state clears it)."""

    # --- writes -----------------------------------------------------------------

    @property
    def chunks(self) -> list[Chunk]:
        """The chunks, the newest rows among them."""
        self.settle()
        return self._chunks

    def append(
        self, rows: Sequence[Row], items: Spans | None = None, *, record: bool = False
    ) -> None:
        """Open the requests of changelog rows (none of them open already). ``items``:
        the rows' items as hashed spans (their item fields are then not read).
        ``record``: their chunk is reported by :meth:`take_built`. They are held as
        they came until something reads them as columns (:meth:`settle`)."""
        if not rows:
            return
        newest = self._newest
        if not newest.accepts(items, record):
            self.settle()
        newest.add(rows, items, record)
        if len(newest) >= merges.SMALL_ROWS:
            self.settle()

    def settle(self) -> None:
        """Make the rows held since the last chunk one chunk (coded with the book)."""
        if not len(self._newest):
            return
        rows, items, record = self._newest.take()
        coded = None if items is None else span_codes(items, self.book)
        chunk = Chunk.of(rows, self.book, coded)
        if record:
            self._built.append(chunk)
        self._add(chunk)

    def take_built(self) -> list[Chunk]:
        """The chunks made of rows appended with ``record`` since the last call, as
        built (before any merge), in order; the rows held are made one first."""
        self.settle()
        built, self._built = self._built, []
        return built

    def add(self, chunk: Chunk) -> None:
        """Open the live rows of a chunk (coded with :attr:`book`, none open already)."""
        self.settle()
        self._add(chunk)

    def _add(self, chunk: Chunk) -> None:
        if chunk.live:
            self._live += chunk.live
            merges.push(self._chunks, chunk)

    def add_many(self, chunks: Iterable[Chunk]) -> None:
        """:meth:`add` of many chunks (a new owner's load): each row copied once, into
        chunks of up to :data:`~evaluator.engine.merges.CHUNK_ROWS` rows; ``chunks`` is
        read as it goes."""
        self.settle()
        for chunk in merges.grouped(chunks):
            self._add(chunk)

    def remove(self, rids: Sequence[str]) -> None:
        """Close open requests (ids not open are ignored)."""
        touched: dict[int, Chunk] = {}
        for found in self._locate(rids):
            if found is None:
                continue
            chunk, row = found
            if chunk.alive[row]:
                chunk.alive[row] = False
                chunk.live -= 1
                self._live -= 1
                touched[id(chunk)] = chunk
        self._compact(touched)

    def _compact(self, touched: dict[int, Chunk]) -> None:
        """Drop the touched chunks with no live row, rewrite those mostly dead."""
        if not touched:
            return
        self._chunks = merges.compacted(self._chunks, touched)
        if len(self.book) >= self._recode_at:
            self._recode()

    def _recode(self) -> None:
        """Rebuild the codebook from the codes in use, if it mostly holds others."""
        used = [c.codes_in_use() for c in self._chunks]
        live = np.unique(np.concatenate(used)) if used else np.zeros(0, np.int32)
        live = live[live >= 0]
        if live.size * 4 > len(self.book):
            self._recode_at = max(RECODE_AT, 2 * len(self.book))
            return
        mapping = np.full(len(self.book), NONE, dtype=np.int32)
        mapping[live] = np.arange(live.size, dtype=np.int32)
        strings = self.book.strings
        self.book = Codebook(strings[c] for c in live.tolist())
        for chunk in self._chunks:
            chunk.recode(mapping)
        self._recode_at = max(RECODE_AT, 2 * len(self.book))
        self.recoded = True

    # --- reads ------------------------------------------------------------------

    def _search(self, rids: Sequence[str]) -> Iterator[tuple[Chunk, I64, I64]]:
        """Per chunk holding some of ``rids`` open: their indexes in ``rids`` and rows
        (the rows held as they came are not searched)."""
        if not rids or not self._live:
            return
        hashes = hashes_of(rids, len(rids))
        for chunk in self._chunks:
            found, rows = chunk.find(rids, hashes)
            if found.size:
                yield chunk, found, rows

    def _locate(self, rids: Sequence[str]) -> list[Location | None]:
        """Where each open request is (None: not open)."""
        self.settle()
        out: list[Location | None] = [None] * len(rids)
        for chunk, found, rows in self._search(rids):
            for i, row in zip(found.tolist(), rows.tolist(), strict=True):
                out[i] = (chunk, row)
        return out

    def contains(self, rids: Sequence[str]) -> list[bool]:
        """Whether each request is open (the rows held as they came stay so)."""
        out = self._newest.holds(rids) if len(self._newest) else np.zeros(len(rids), np.bool_)
        for _, found, _ in self._search(rids):
            out[found] = True
        return out.tolist()

    def times(self, rids: Sequence[str]) -> list[int | None]:
        """The impression time of each request (None: not open)."""
        self.settle()
        out: list[int | None] = [None] * len(rids)
        for chunk, found, rows in self._search(rids):
            for i, t in zip(found.tolist(), chunk.ts[rows].tolist(), strict=True):
                out[i] = t
        return out

    def get(self, rid: str) -> OpenRequest | None:
        found = self._locate([rid])[0]
        if found is None:
            return None
        chunk, row = found
        return chunk.requests(np.array([row], dtype=np.int64), self.book.strings)[0]

    def due(self, through_ms: int) -> tuple[Due, Places]:
        """The open requests of impression time at or before ``through_ms``, as columns
        in order of (time, request id): the order their deadlines fall in. Also where
        they are, for :meth:`close` (valid until the next write: no read builds a
        chunk of the rows held as they came but this one, :meth:`peek` and
        :meth:`count_due` when those may be due, so the finalisation between the two
        moves no row)."""
        if self._newest.reaches(through_ms):
            self.settle()
        places: Places = []
        parts: list[Due] = []
        for chunk in self._chunks:
            if not chunk.within(NEVER, through_ms):
                continue
            rows = np.flatnonzero(chunk.alive & (chunk.ts <= through_ms))
            if rows.size:
                places.append((chunk, rows))
                parts.append(chunk.due(rows, self.book.strings))
        due = Due.concat(parts)
        order = time_order(due.ms, due.request_id)
        return (due if order is None else due.take(order)), places

    def peek(self, after_ms: int, through_ms: int) -> Due:
        """The open requests of impression time in ``(after_ms, through_ms]``, as
        :meth:`due` orders them, left open."""
        if self._newest.reaches(through_ms):
            self.settle()
        parts = [
            chunk.due(rows, self.book.strings)
            for chunk in self._chunks
            if chunk.within(after_ms, through_ms)
            and (
                rows := np.flatnonzero(
                    chunk.alive & (chunk.ts > after_ms) & (chunk.ts <= through_ms)
                )
            ).size
        ]
        due = Due.concat(parts)
        order = time_order(due.ms, due.request_id)
        return due if order is None else due.take(order)

    def close(self, places: Places) -> None:
        """Close the requests :meth:`due` found (their chunks did not change since)."""
        touched: dict[int, Chunk] = {}
        for chunk, rows in places:
            alive = rows[chunk.alive[rows]]
            if alive.size:
                chunk.alive[alive] = False
                chunk.live -= int(alive.size)
                self._live -= int(alive.size)
                touched[id(chunk)] = chunk
        self._compact(touched)

    def count_due(self, through_ms: int) -> int:
        if self._newest.reaches(through_ms):
            self.settle()
        return sum(
            int((c.alive & (c.ts <= through_ms)).sum())
            for c in self._chunks
            if c.within(NEVER, through_ms)
        )

    def of_users(self, uids: Sequence[str]) -> Shown:
        """The open requests of the given users, as columns: user, impression time,
        request id and the codes of the items shown."""
        users: list[str] = []
        requests: list[str] = []
        times: list[I64] = []
        items: list[Ragged] = []
        if self._newest.has_user(uids):  # read where they are: see :meth:`due`
            held, codes = self._newest.of_users(set(uids), self.book)
            users += [row[1] for row in held]
            requests += [row[0] for row in held]
            times.append(np.array([row[3] for row in held], dtype=np.int64))
            items.append(codes)
        if uids and self._live:
            wanted = set(uids)
            hashes = hashes_of(uids, len(uids))
            for chunk in self._chunks:
                maybe = hashes[chunk.by_user.may_hold(hashes)]
                if not maybe.size:
                    continue
                rows = np.unique(chunk.by_user.find_all(maybe))
                rows = rows[chunk.alive[rows]]
                if not rows.size:
                    continue
                found = chunk.users.texts(rows)
                keep = [uid in wanted for uid in found]  # False: a hash collision
                if not all(keep):
                    rows, found = rows[keep], [u for u, k in zip(found, keep, strict=True) if k]
                users += found
                requests += chunk.ids.texts(rows)
                times.append(chunk.ts[rows])
                items.append(chunk.items.take(rows))
        if not items:
            return Shown([], np.zeros(0, np.int64), [], Ragged.of(np.zeros(0, np.int64), []))
        return Shown(users, np.concatenate(times), requests, Ragged.concat(items))

    def all(self) -> list[OpenRequest]:
        out: list[OpenRequest] = []
        for chunk in self.chunks:
            out += chunk.requests(np.flatnonzero(chunk.alive), self.book.strings)
        return out

    def __len__(self) -> int:
        return self._live + len(self._newest)

    @property
    def nbytes(self) -> int:
        """Bytes of the chunks' arrays (the codebook aside)."""
        return sum(c.nbytes for c in self.chunks)

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self.contains([rid])[0]

    def __getitem__(self, rid: str) -> OpenRequest:
        found = self.get(rid)
        if found is None:
            raise KeyError(rid)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter([r.request_id for r in self.all()])

    def as_dict(self) -> dict[str, OpenRequest]:
        return {r.request_id: r for r in self.all()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OpenTable):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]
