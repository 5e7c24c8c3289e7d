"""A partition's open requests as columns: codes and arrays, not an object each. Pure.

An open request is a row of a chunk: its impression time, its labels (variant,
context, shadow variant, randomisation) and its item ids, attribute values and
shadow ranking as ``int32`` codes of the partition's :class:`Codebook`, its request
and user ids as UTF-8 bytes, and each id's 64-bit hash, sorted, for lookups by
binary search. About a fifth of the memory of the objects it replaces (see
BENCHMARKS.md), and batch-friendly: a lookup of many ids is one search per chunk.

Rows are appended a batch at a time as a new chunk; small chunks are merged into
larger ones (up to :data:`CHUNK_ROWS` rows), dropping the rows finalised in the
meantime, so a chunk is a stretch of arrival order, which is nearly deadline order.
A finished row is only marked dead; a chunk goes when all its rows have, and one
mostly dead is rewritten with its live rows. :class:`~evaluator.core.finalise.OpenRequest`
objects are made only for the requests being finalised (or asked for).

Rows come and go as the changelog's request rows
(:func:`evaluator.engine.records.request_row`): the same tuples are encoded there.
A hash found is checked against the stored id, so a collision cannot join the
wrong request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, pairwise, repeat
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from evaluator.core.finalise import OpenRequest

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
U8 = npt.NDArray[np.uint8]
Row = Sequence[Any]
"""``(request id, user id, variant, time, items, attributes, shadow variant, shadow,
context, randomisation [kind, n] or None)``: a changelog request row."""

CHUNK_ROWS = 16_384
"""Rows per chunk at most: few chunks to search, little memory held by a straggler."""
RECODE_AT = 1 << 19
"""Codebook entries before the codes of live rows are counted and the book rebuilt
(when it holds four times as many as are in use): a churning catalog stays bounded."""

NONE = -1
"""The code of an absent label (no randomisation)."""


class Codebook:
    """Strings as ``int32`` codes: one entry per distinct item id, attribute value or
    label of the partition's open requests, each string kept once."""

    __slots__ = ("codes", "strings")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self.strings: list[str] = []
        self.codes: dict[str, int] = {}
        for s in strings:
            self.code(s)

    def code(self, value: str) -> int:
        found = self.codes.get(value)
        if found is None:
            found = self.codes[value] = len(self.strings)
            self.strings.append(value)
        return found

    def encode(self, values: Sequence[str]) -> I32:
        """The codes of ``values`` (new ones are added)."""
        codes = list(map(self.codes.get, values, repeat(NONE)))
        if NONE in codes:
            code = self.code
            codes = [c if c != NONE else code(v) for c, v in zip(codes, values, strict=True)]
        return np.array(codes, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.strings)


@dataclass(slots=True)
class Ragged:
    """Variable-length rows in one flat array: row i is ``flat[off[i]:off[i + 1]]``."""

    flat: npt.NDArray[Any]
    off: I32
    """Row bounds (``int32``: a chunk holds far fewer than 2**31 values)."""

    @classmethod
    def of(cls, flat: npt.NDArray[Any], lengths: Sequence[int]) -> Ragged:
        off = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        return cls(flat, off.astype(np.int32))

    def take(self, rows: I64) -> Ragged:
        starts = self.off[rows].astype(np.int64)
        lengths = self.off[rows + 1] - starts
        off = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        index = np.repeat(starts - off[:-1], lengths) + np.arange(off[-1], dtype=np.int64)
        return Ragged(self.flat[index], off.astype(np.int32))

    def rows(self, rows: I64) -> list[list[Any]]:
        """The given rows' values as Python lists."""
        if not self.flat.size:
            return [[] for _ in range(rows.size)]
        part = self.take(rows)
        values, bounds = part.flat.tolist(), part.off.tolist()
        return [values[a:b] for a, b in pairwise(bounds)]

    def texts(self, rows: I64) -> list[str]:
        """The given rows of UTF-8 bytes, decoded."""
        part = self.take(rows)
        raw, bounds = part.flat.tobytes(), part.off.tolist()
        if raw.isascii():  # one decode; a character is a byte
            text = raw.decode()
            return [text[a:b] for a, b in pairwise(bounds)]
        return [raw[a:b].decode() for a, b in pairwise(bounds)]

    @staticmethod
    def concat(parts: Sequence[Ragged]) -> Ragged:
        shift = np.cumsum([0] + [int(p.off[-1]) for p in parts[:-1]])
        off = np.concatenate([[0]] + [p.off[1:] + s for p, s in zip(parts, shift, strict=True)])
        return Ragged(np.concatenate([p.flat for p in parts]), off.astype(np.int32))


def _texts(values: Sequence[str]) -> Ragged:
    raw = [v.encode() for v in values]
    return Ragged.of(np.frombuffer(b"".join(raw), dtype=np.uint8), list(map(len, raw)))


def _hashes(values: Iterable[str], n: int) -> I64:
    return np.fromiter(map(hash, values), dtype=np.int64, count=n)


@dataclass(slots=True)
class Index:
    """Hashes sorted, with the row of each: many lookups by one binary search."""

    keys: I64
    rows: I32

    @classmethod
    def of(cls, hashes: I64) -> Index:
        order = np.argsort(hashes, kind="stable")
        return cls(hashes[order], order.astype(np.int32))

    def per_row(self) -> I64:
        out = np.empty_like(self.keys)
        out[self.rows] = self.keys
        return out

    def spans(self, hashes: I64) -> tuple[I64, I64]:
        """Where each hash's rows are in :attr:`rows`: ``[lo, hi)`` (empty: none)."""
        lo = np.searchsorted(self.keys, hashes, side="left")
        return lo, np.searchsorted(self.keys, hashes, side="right")

    def find_all(self, hashes: I64) -> I64:
        """Every row holding one of the hashes."""
        lo = np.searchsorted(self.keys, hashes, side="left")
        hi = np.searchsorted(self.keys, hashes, side="right")
        spans = [self.rows[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]
        return np.concatenate(spans).astype(np.int64) if spans else np.zeros(0, np.int64)


@dataclass(slots=True)
class Chunk:
    """Rows of open requests, as columns (see the module docstring)."""

    ts: I64
    labels: npt.NDArray[Any]
    """Per row (``int16`` or ``int32``): the codes of the variant, context, shadow
    variant and randomisation kind (-1: none)."""
    randomized: I32
    """The randomisation's parameter (top-n or swap depth; 0: none)."""
    alive: npt.NDArray[np.bool_]
    ids: Ragged
    users: Ragged
    items: Ragged
    attributes: Ragged
    shadow: Ragged
    by_id: Index
    by_user: Index
    live: int

    @property
    def size(self) -> int:
        return int(self.ts.size)

    @classmethod
    def of(cls, rows: Sequence[Row], book: Codebook) -> Chunk:
        n = len(rows)
        rids = [r[0] for r in rows]
        uids = [r[1] for r in rows]
        items, attributes, shadow = (_codes([r[k] for r in rows], book) for k in (4, 5, 7))
        labels = np.full((n, 4), NONE, dtype=np.int32)
        for column, k in enumerate((2, 8, 6)):  # variant, context, shadow variant
            labels[:, column] = book.encode([r[k] for r in rows])
        randomized = [i for i, r in enumerate(rows) if r[9]]
        if randomized:
            labels[randomized, 3] = book.encode([rows[i][9][0] for i in randomized])
        labels = _narrow(labels, len(book), signed=True)
        return cls(
            np.fromiter((r[3] for r in rows), dtype=np.int64, count=n),
            labels,
            np.fromiter((r[9][1] if r[9] else 0 for r in rows), dtype=np.int32, count=n),
            np.ones(n, dtype=np.bool_),
            _texts(rids),
            _texts(uids),
            items,
            attributes,
            shadow,
            Index.of(_hashes(rids, n)),
            Index.of(_hashes(uids, n)),
            n,
        )

    def take(self, rows: I64) -> Chunk:
        """A chunk of the given rows (an index array, in order)."""
        return Chunk(
            self.ts[rows],
            self.labels[rows],
            self.randomized[rows],
            self.alive[rows],
            self.ids.take(rows),
            self.users.take(rows),
            self.items.take(rows),
            self.attributes.take(rows),
            self.shadow.take(rows),
            Index.of(self.by_id.per_row()[rows]),
            Index.of(self.by_user.per_row()[rows]),
            int(self.alive[rows].sum()),
        )

    @staticmethod
    def concat(parts: Sequence[Chunk]) -> Chunk:
        ids, users, items, attributes, shadow = (
            Ragged.concat([getattr(p, n) for p in parts]) for n in _RAGGED
        )
        by_id, by_user = (
            np.concatenate([getattr(p, n).per_row() for p in parts]) for n in _INDEXED
        )
        return Chunk(
            np.concatenate([p.ts for p in parts]),
            np.concatenate([p.labels for p in parts]),
            np.concatenate([p.randomized for p in parts]),
            np.concatenate([p.alive for p in parts]),
            ids,
            users,
            items,
            attributes,
            shadow,
            Index.of(by_id),
            Index.of(by_user),
            sum(p.live for p in parts),
        )

    def requests(self, rows: I64, strings: list[str], coded: bool = False) -> list[OpenRequest]:
        """The given rows as request objects (strings shared through the codebook);
        ``coded``: items, attribute values and the shadow ranking as their codes."""
        decode = strings.__getitem__
        none = [()] * rows.size
        items, attrs, shadow = (
            none
            if not part.flat.size
            else part.rows(rows)
            if coded
            else [tuple(map(decode, r)) for r in part.rows(rows)]
            for part in (self.items, self.attributes, self.shadow)
        )
        labels = self.labels[rows].tolist()
        out = []
        for rid, uid, ts, (variant, context, shadow_of, kind), n, its, ats, sh in zip(
            self.ids.texts(rows),
            self.users.texts(rows),
            self.ts[rows].tolist(),
            labels,
            self.randomized[rows].tolist(),
            items,
            attrs,
            shadow,
            strict=True,
        ):
            out.append(
                OpenRequest(
                    rid,
                    uid,
                    strings[variant],
                    ts,
                    its,
                    (),
                    ats,
                    strings[shadow_of],
                    sh,
                    strings[context],
                    (strings[kind], n) if kind != NONE else None,
                )
            )
        return out

    def codes_in_use(self) -> I32:
        live = np.flatnonzero(self.alive)
        parts = [self.labels[live].ravel()]
        parts += [p.take(live).flat for p in (self.items, self.attributes, self.shadow)]
        return np.concatenate(parts).astype(np.int32)

    def recode(self, mapping: I32) -> None:
        """Replace every code ``c`` by ``mapping[c]`` (of live rows; a dead row's codes
        may become meaningless)."""
        size = int(mapping.max(initial=0)) + 1
        labels = self.labels
        self.labels = _narrow(
            np.where(labels >= 0, mapping[np.maximum(labels, 0)], NONE), size, signed=True
        )
        for part in (self.items, self.attributes, self.shadow):
            part.flat = _narrow(np.maximum(mapping[part.flat], 0), size)


_RAGGED = ("ids", "users", "items", "attributes", "shadow")
_INDEXED = ("by_id", "by_user")


def _codes(lists: Sequence[Sequence[str]], book: Codebook) -> Ragged:
    codes = book.encode(list(chain.from_iterable(lists)) if lists else [])
    return Ragged.of(_narrow(codes, len(book)), list(map(len, lists)))


def _narrow(codes: npt.NDArray[Any], size: int, *, signed: bool = False) -> npt.NDArray[Any]:
    """Codes of a book of ``size`` entries in 16 bits where they fit (most catalogs'
    open requests), else 32."""
    small = np.int16 if signed else np.uint16
    return codes.astype(small if size <= np.iinfo(small).max else np.int32)


Location = tuple[Chunk, int]


class Shown(NamedTuple):
    """Open requests as columns: user, impression time, request id, item codes."""

    user: list[str]
    ms: list[int]
    request: list[str]
    items: list[list[int]]


class OpenTable:
    """The open requests of one partition, by request id (see the module docstring)."""

    def __init__(self) -> None:
        self.book = Codebook()
        self.chunks: list[Chunk] = []
        self._live = 0
        self._recode_at = RECODE_AT

    # --- writes -----------------------------------------------------------------

    def append(self, rows: Sequence[Row]) -> None:
        """Open the requests of changelog rows (none of them open already)."""
        if not rows:
            return
        chunks = self.chunks
        chunks.append(Chunk.of(rows, self.book))
        self._live += len(rows)
        # merge while the newer chunk is as large as the one before (amortised: each
        # row is copied a logarithmic number of times), dropping finished rows
        while len(chunks) >= 2 and chunks[-2].live <= chunks[-1].live:
            a, b = chunks[-2], chunks[-1]
            if a.live + b.live > CHUNK_ROWS:
                break
            chunks[-2:] = [Chunk.concat([_live_part(a), _live_part(b)])]

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
        if not touched:
            return
        kept = []
        for chunk in self.chunks:
            if id(chunk) not in touched or chunk.live * 4 >= chunk.size:
                kept.append(chunk)
            elif chunk.live:
                kept.append(_live_part(chunk))
        self.chunks = kept
        if len(self.book) >= self._recode_at:
            self._recode()

    def _recode(self) -> None:
        """Rebuild the codebook from the codes in use, if it mostly holds others."""
        used = [c.codes_in_use() for c in self.chunks]
        live = np.unique(np.concatenate(used)) if used else np.zeros(0, np.int32)
        live = live[live >= 0]
        if live.size * 4 > len(self.book):
            self._recode_at = max(RECODE_AT, 2 * len(self.book))
            return
        mapping = np.full(len(self.book), NONE, dtype=np.int32)
        mapping[live] = np.arange(live.size, dtype=np.int32)
        strings = self.book.strings
        self.book = Codebook(strings[c] for c in live.tolist())
        for chunk in self.chunks:
            chunk.recode(mapping)
        self._recode_at = max(RECODE_AT, 2 * len(self.book))

    # --- reads ------------------------------------------------------------------

    def _locate(self, rids: Sequence[str]) -> list[Location | None]:
        """Where each open request is (None: not open)."""
        out: list[Location | None] = [None] * len(rids)
        if not rids or not self._live:
            return out
        hashes = _hashes(rids, len(rids))
        for chunk in self.chunks:
            lo, hi = chunk.by_id.spans(hashes)
            width = hi - lo
            found = np.flatnonzero(width > 0)
            if not found.size:
                continue
            # one row per hash but for a collision: check the stored ids of live rows
            rows = chunk.by_id.rows[lo[found]].astype(np.int64)
            if (width[found] > 1).any():
                spans = [chunk.by_id.rows[a:b] for a, b in zip(lo[found], hi[found], strict=True)]
                found = np.repeat(found, width[found])
                rows = np.concatenate(spans).astype(np.int64)
            live = chunk.alive[rows]
            found, rows = found[live], rows[live]
            stored = chunk.ids.texts(rows)
            for i, row, rid in zip(found.tolist(), rows.tolist(), stored, strict=True):
                if rid == rids[i]:
                    out[i] = (chunk, row)
        return out

    def contains(self, rids: Sequence[str]) -> list[bool]:
        return [found is not None for found in self._locate(rids)]

    def times(self, rids: Sequence[str]) -> list[int | None]:
        """The impression time of each request (None: not open)."""
        return [int(f[0].ts[f[1]]) if f is not None else None for f in self._locate(rids)]

    def get(self, rid: str) -> OpenRequest | None:
        found = self._locate([rid])[0]
        if found is None:
            return None
        chunk, row = found
        return chunk.requests(np.array([row], dtype=np.int64), self.book.strings)[0]

    def due(self, through_ms: int, coded: bool = False) -> list[OpenRequest]:
        """The open requests of impression time at or before ``through_ms``, in order of
        (time, request id): the order their deadlines fall in (``coded``: see
        :meth:`Chunk.requests`)."""
        out: list[OpenRequest] = []
        for chunk in self.chunks:
            rows = np.flatnonzero(chunk.alive & (chunk.ts <= through_ms))
            if rows.size:
                out += chunk.requests(rows, self.book.strings, coded)
        out.sort(key=lambda r: (r.timestamp_ms, r.request_id))
        return out

    def count_due(self, through_ms: int) -> int:
        return sum(int((c.alive & (c.ts <= through_ms)).sum()) for c in self.chunks)

    def of_users(self, uids: Sequence[str]) -> Shown:
        """The open requests of the given users, as columns: user, impression time,
        request id and the codes of the items shown."""
        out = Shown([], [], [], [])
        if not uids or not self._live:
            return out
        wanted = set(uids)
        hashes = _hashes(uids, len(uids))
        for chunk in self.chunks:
            rows = np.unique(chunk.by_user.find_all(hashes))
            rows = rows[chunk.alive[rows]]
            if not rows.size:
                continue
            users = chunk.users.texts(rows)
            keep = [uid in wanted for uid in users]  # False: a hash collision
            if not all(keep):
                rows, users = rows[keep], [u for u, k in zip(users, keep, strict=True) if k]
            out.user.extend(users)
            out.ms.extend(chunk.ts[rows].tolist())
            out.request.extend(chunk.ids.texts(rows))
            out.items.extend(chunk.items.rows(rows))
        return out

    def all(self) -> list[OpenRequest]:
        out: list[OpenRequest] = []
        for chunk in self.chunks:
            out += chunk.requests(np.flatnonzero(chunk.alive), self.book.strings)
        return out

    def __len__(self) -> int:
        return self._live

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self._locate([rid])[0] is not None

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


def _live_part(chunk: Chunk) -> Chunk:
    if chunk.live == chunk.size:
        return chunk
    return chunk.take(np.flatnonzero(chunk.alive))
