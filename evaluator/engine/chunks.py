"""The rows of a partition's open requests as columns: one chunk of them and its
codebook (:mod:`evaluator.engine.segments` writes a chunk to the changelog). Pure.

A row holds a request's impression time, its labels (variant, context, shadow
variant, randomisation, interleaving draft) as codes of the partition's
:class:`Codebook` in the fewest bytes, its item ids, attribute values and shadow
ranking as 16- or 32-bit codes, its request and user ids as UTF-8 bytes (ids of a
common prefix and a UUID as 16 bytes, :mod:`evaluator.engine.uuids`), and each
id's 64-bit hash, sorted, for lookups by binary search.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluator.core.due import Due, OpenRequest, Ragged, requests_of
from evaluator.core.tokens import Spans
from evaluator.engine import uuids
from evaluator.engine.codebook import NONE, Codebook
from evaluator.engine.uuids import IdColumn

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Row = Sequence[Any]
"""``(request id, user id, variant, time, items, attributes, shadow variant, shadow,
context, randomisation [kind, n] or None, draft)``: a changelog request row (one
written before interleaving has no draft)."""
LABELS = 5
"""Label columns: variant, context, shadow variant, randomisation kind, draft."""


def _texts(values: Sequence[str]) -> Ragged:
    raw = [v.encode() for v in values]
    return Ragged.of(np.frombuffer(b"".join(raw), dtype=np.uint8), list(map(len, raw)))


def hashes_of(values: Iterable[str], n: int) -> I64:
    return np.fromiter(map(hash, values), dtype=np.int64, count=n)


@dataclass(slots=True)
class Index:
    """Hashes sorted, with the row of each: many lookups by one binary search. A bit
    filter over the hashes' low bits (about 8 bits a row) answers "not here" for most
    hashes absent from the chunk with one array read, before any search."""

    keys: I64
    rows: I32
    bits: npt.NDArray[np.uint8]

    @classmethod
    def of(cls, hashes: I64) -> Index:
        order = np.argsort(hashes, kind="stable")
        return cls._sorted(hashes[order], order.astype(np.int32))

    @classmethod
    def _sorted(cls, keys: I64, rows: I32) -> Index:
        size = 64
        while size < 8 * keys.size:
            size *= 2
        present = np.zeros(size, dtype=np.bool_)
        present[keys & (size - 1)] = True
        return cls(keys, rows, np.packbits(present, bitorder="little"))

    def take(self, rows: I64, size: int) -> Index:
        """The index of the given rows (in order) of its ``size`` rows, renumbered from
        0: no sort, the order is kept."""
        renumbered = np.full(size, -1, dtype=np.int32)
        renumbered[rows] = np.arange(rows.size, dtype=np.int32)
        new = renumbered[self.rows]
        kept = new >= 0
        return Index._sorted(self.keys[kept], new[kept])

    @classmethod
    def merged(cls, parts: Sequence[tuple[int, Index]]) -> Index:
        """The indexes of chunks (each with its number of rows) one after another: a
        stable sort of sorted runs, near linear (rows of equal hashes stay in row order,
        as :meth:`of` leaves them)."""
        shifts = np.cumsum([0] + [size for size, _ in parts[:-1]])
        keys = np.concatenate([index.keys for _, index in parts])
        rows = np.concatenate(
            [index.rows + np.int32(shift) for (_, index), shift in zip(parts, shifts, strict=True)]
        )
        order = np.argsort(keys, kind="stable")
        return cls._sorted(keys[order], rows[order])

    def may_hold(self, hashes: I64) -> npt.NDArray[np.bool_]:
        """False for hashes surely absent (true for those present, and a few others)."""
        slot = hashes & (self.bits.size * 8 - 1)
        return (self.bits[slot >> 3] >> (slot & 7).astype(np.uint8)) & 1 == 1  # type: ignore[no-any-return]

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
        counts = np.searchsorted(self.keys, hashes, side="right") - lo
        total = int(counts.sum())
        starts = np.cumsum(counts) - counts
        index = np.repeat(lo - starts, counts) + np.arange(total)
        return self.rows[index].astype(np.int64)


@dataclass(slots=True)
class Chunk:
    """Rows of open requests, as columns (see the module docstring)."""

    ts: I64
    labels: npt.NDArray[Any]
    """Per row (``int8``, ``int16`` or ``int32``: :func:`fewest`): the codes of the
    variant, context, shadow variant, randomisation kind and interleaving draft (-1:
    none)."""
    randomized: I32
    """The randomisation's parameter (top-n or swap depth; 0: none)."""
    alive: npt.NDArray[np.bool_]
    ids: IdColumn
    users: IdColumn
    items: Ragged
    attributes: Ragged
    shadow: Ragged
    by_id: Index
    by_user: Index
    live: int
    attribute_values: npt.NDArray[Any] | None = None
    """The distinct codes that :attr:`attributes` indexes (None: it holds the codes):
    an attribute has few values, so each takes a byte (:func:`dictionary`)."""
    first_ms: int = 0
    last_ms: int = -1
    """The earliest and latest impression time of its rows (live or not): a scan by
    time passes over the chunks outside its span without reading them."""

    def __post_init__(self) -> None:
        if self.attribute_values is None:
            self.attributes, self.attribute_values = dictionary(self.attributes)
        self.attributes = _sharing(self.attributes, self.items.off)
        if not self.shadow.flat.size:  # no shadow ranking: bounds of one value, no array
            self.shadow = Ragged(self.shadow.flat, np.broadcast_to(_ZERO, self.shadow.off.shape))
        if self.ts.size:
            self.first_ms, self.last_ms = int(self.ts.min()), int(self.ts.max())

    def within(self, after_ms: int, through_ms: int) -> bool:
        """Whether some of its rows may be of a time in ``(after_ms, through_ms]``."""
        return self.first_ms <= through_ms and self.last_ms > after_ms

    def attribute_codes(self, rows: I64 | None = None) -> Ragged:
        """The attribute values of the given rows (all: None) as codes of the book."""
        part = self.attributes if rows is None else self.attributes.take(rows)
        if self.attribute_values is None:
            return part
        return Ragged(self.attribute_values[part.flat], part.off)

    @property
    def size(self) -> int:
        return int(self.ts.size)

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays (an array two columns share counted once, a broadcast
        one not)."""
        arrays = [self.ts, self.labels, self.randomized, self.alive]
        arrays += uuids.arrays(self.ids) + uuids.arrays(self.users)
        arrays += [a for p in (self.items, self.attributes, self.shadow) for a in (p.flat, p.off)]
        arrays += [self.by_id.keys, self.by_id.rows, self.by_user.keys, self.by_user.rows]
        arrays += [self.by_id.bits, self.by_user.bits]
        if self.attribute_values is not None:
            arrays.append(self.attribute_values)
        distinct = {id(a): a for a in arrays if 0 not in a.strides or a.size <= 1}
        return sum(a.nbytes for a in distinct.values())

    def find(self, rids: Sequence[str], hashes: I64) -> tuple[I64, I64]:
        """The live rows holding some of ``rids`` (their ``hashes``): their indexes in
        ``rids`` and rows. A hash found is checked against the stored id."""
        keys = self.by_id.keys
        none = np.zeros(0, dtype=np.int64)
        maybe = np.flatnonzero(self.by_id.may_hold(hashes)) if keys.size else none
        if not maybe.size:
            return none, none
        lo = np.searchsorted(keys, hashes[maybe])
        hit = keys[np.minimum(lo, keys.size - 1)] == hashes[maybe]
        found, lo = maybe[hit], lo[hit]
        if not found.size:
            return none, none
        rows = self.by_id.rows[lo].astype(np.int64)
        hi = np.searchsorted(keys, hashes[found], side="right")
        if (hi - lo > 1).any():  # a collision: every row of the hash is a candidate
            spans = [self.by_id.rows[a:b] for a, b in zip(lo, hi, strict=True)]
            found = np.repeat(found, hi - lo)
            rows = np.concatenate(spans).astype(np.int64)
        live = self.alive[rows]
        found, rows = found[live], rows[live]
        same = _same_ids(self.ids.take(rows), [rids[i] for i in found.tolist()])
        if same is not None:
            found, rows = found[same], rows[same]
        return found, rows

    @classmethod
    def of(cls, rows: Sequence[Row], book: Codebook, items: Ragged | None = None) -> Chunk:
        """The rows as a chunk coded with ``book``; ``items``: their items' codes
        already (the rows' item fields are then not read)."""
        n = len(rows)
        rids = [r[0] for r in rows]
        uids = [r[1] for r in rows]
        if items is None:
            items = list_codes([r[4] for r in rows], book)
        attributes, shadow = (list_codes([r[k] for r in rows], book) for k in (5, 7))
        labels = np.full((n, LABELS), NONE, dtype=np.int32)
        for column, k in enumerate((2, 8, 6)):  # variant, context, shadow variant
            labels[:, column] = book.encode([r[k] for r in rows])
        randomized = [i for i, r in enumerate(rows) if r[9]]
        if randomized:
            labels[randomized, 3] = book.encode([rows[i][9][0] for i in randomized])
        drafted = [i for i, r in enumerate(rows) if len(r) > 10 and r[10]]
        if drafted:
            labels[drafted, 4] = book.encode([rows[i][10] for i in drafted])
        parameters = np.fromiter((r[9][1] if r[9] else 0 for r in rows), dtype=np.int64, count=n)
        return cls(
            np.fromiter((r[3] for r in rows), dtype=np.int64, count=n),
            fewest(labels),
            fewest(parameters),
            np.ones(n, dtype=np.bool_),
            uuids.compact(_texts(rids)),
            uuids.compact(_texts(uids)),
            items,
            attributes,
            shadow,
            Index.of(hashes_of(rids, n)),
            Index.of(hashes_of(uids, n)),
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
            self.by_id.take(rows, self.size),
            self.by_user.take(rows, self.size),
            int(self.alive[rows].sum()),
            self.attribute_values,
        )

    @staticmethod
    def concat(parts: Sequence[Chunk]) -> Chunk:
        ids, users = (uuids.concat([getattr(p, n) for p in parts]) for n in ("ids", "users"))
        items, shadow = (Ragged.concat([getattr(p, n) for p in parts]) for n in ("items", "shadow"))
        attributes = Ragged.concat([p.attribute_codes() for p in parts])
        by_id, by_user = (Index.merged([(p.size, getattr(p, n)) for p in parts]) for n in _INDEXED)
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
            by_id,
            by_user,
            sum(p.live for p in parts),
        )

    def requests(self, rows: I64, strings: list[str]) -> list[OpenRequest]:
        """The given rows as request objects, strings decoded (lookups, tests)."""
        return requests_of(self.due(rows, strings), strings)

    def due(self, rows: I64, strings: list[str]) -> Due:
        """The given rows as columns for finalisation (lists stay codes)."""
        labels = self.labels[rows]
        variant, context, shadow_of, kind = (labels[:, j].tolist() for j in range(4))
        decode = strings.__getitem__
        drafted = labels[:, 4] != NONE
        return Due(
            self.ids.texts(rows),
            self.users.texts(rows),
            list(map(decode, variant)),
            self.ts[rows],
            self.items.take(rows),
            self.attribute_codes(rows),
            list(map(decode, shadow_of)),
            self.shadow.take(rows),
            list(map(decode, context)),
            [
                (strings[k], n) if k != NONE else None
                for k, n in zip(kind, self.randomized[rows].tolist(), strict=True)
            ]
            if (labels[:, 3] != NONE).any()
            else [None] * rows.size,
            draft=[strings[k] if k != NONE else "" for k in labels[:, 4].tolist()]
            if drafted.any()
            else None,
        )

    def codes_in_use(self) -> I32:
        live = np.flatnonzero(self.alive)
        parts = [self.labels[live].ravel()]
        parts += [self.items.take(live).flat, self.attribute_codes(live).flat]
        parts.append(self.shadow.take(live).flat)
        return np.concatenate(parts).astype(np.int32)

    def recode(self, mapping: I32) -> None:
        """Replace every code ``c`` by ``mapping[c]`` (of live rows; a dead row's codes
        may become meaningless)."""
        size = int(mapping.max(initial=0)) + 1
        labels = self.labels
        self.labels = fewest(np.where(labels >= 0, mapping[np.maximum(labels, 0)], NONE))
        for part in (self.items, self.shadow):
            part.flat = _narrow(np.maximum(mapping[part.flat], 0), size)
        if self.attribute_values is None:
            self.attributes.flat = _narrow(np.maximum(mapping[self.attributes.flat], 0), size)
        else:
            self.attribute_values = _narrow(np.maximum(mapping[self.attribute_values], 0), size)


_INDEXED = ("by_id", "by_user")


SAMPLE = 2_048
"""Values looked at first: more than 256 distinct among them, and 16-bit codes cannot
take a byte each (the usual answer for items, found without a pass over them all)."""


def dictionary(part: Ragged) -> tuple[Ragged, npt.NDArray[Any] | None]:
    """A column of codes (none negative) as each value's index among its distinct
    codes, and those codes, when the index is narrower than the codes (one byte for at
    most 256 distinct codes, two for 65,536); else the column as it is, and None.
    Found with a table over the codes when they are dense, else with a sort."""
    flat = part.flat
    if flat.size == 0 or flat.dtype.itemsize == 1 or int(flat.min()) < 0:
        return part, None
    if flat.dtype.itemsize == 2 and np.unique(flat[:SAMPLE]).size > 2**8:
        return part, None  # 16-bit codes of many values (items): no byte index
    top = int(flat.max()) + 1
    if top <= 4 * flat.size:  # a table over the codes: no sort
        present = np.zeros(top, dtype=np.bool_)
        present[flat] = True
        distinct = np.flatnonzero(present)
        position = None
    else:  # few values among many codes (a large catalog): sort the values
        distinct, position = np.unique(flat, return_inverse=True)
    index_type = np.uint8 if distinct.size <= 2**8 else np.uint16
    if distinct.size > 2**16 or np.dtype(index_type).itemsize >= flat.dtype.itemsize:
        return part, None
    if position is None:
        position = (np.cumsum(present) - 1)[flat]
    index = position.reshape(-1).astype(index_type)
    return Ragged(index, part.off), distinct.astype(flat.dtype)


def list_codes(lists: Sequence[Sequence[str]], book: Codebook) -> Ragged:
    """The codes of lists of strings (one row per list), new strings added to ``book``."""
    codes = book.encode(list(chain.from_iterable(lists)) if lists else [])
    return Ragged.of(_narrow(codes, len(book)), list(map(len, lists)))


def span_codes(spans: Spans, book: Codebook) -> Ragged:
    """The codes of hashed spans (one row per owner), new strings added to ``book``."""
    return Ragged(_narrow(book.encode_spans(spans), len(book)), spans.off.astype(np.int32))


def _narrow(codes: npt.NDArray[Any], size: int) -> npt.NDArray[Any]:
    """Codes of a book of ``size`` entries in 16 bits where they fit (most catalogs'
    open requests), else 32."""
    return codes.astype(np.uint16 if size <= np.iinfo(np.uint16).max else np.int32)


def fewest(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Integers in the narrowest signed type that holds them: a chunk's labels (codes,
    -1 for none) and randomisation parameters in memory, the fixed columns of a
    segment. Labels are codes of the few strings a book met early (variants,
    contexts): two bytes each, or one, where a large catalog's items need four."""
    low, high = int(values.min(initial=0)), int(values.max(initial=0))
    for kind in (np.int8, np.int16, np.int32):
        info = np.iinfo(kind)
        if info.min <= low and high <= info.max:
            return values.astype(kind)
    return values.astype(np.int64)


_ZERO = np.zeros((), dtype=np.int32)


def _sharing(part: Ragged, off: I32) -> Ragged:
    """``part`` with ``off`` as its row bounds when they are equal (the attribute
    values of each item: one array of bounds for both columns)."""
    if part.off is off or not np.array_equal(part.off, off):
        return part
    return Ragged(part.flat, off)


def _same_ids(stored: IdColumn, wanted: list[str]) -> npt.NDArray[np.bool_] | None:
    """Which stored ids (UTF-8 rows) equal the wanted ones (None: all do, the usual
    answer, found with one comparison of the joined bytes when the lengths agree)."""
    text = "".join(wanted)
    sized = map(len, wanted) if text.isascii() else (len(w.encode()) for w in wanted)
    lengths = np.fromiter(sized, dtype=np.int64, count=len(wanted))
    joined = text.encode()
    if np.array_equal(stored.lengths(), lengths) and stored.flat.tobytes() == joined:
        return None
    texts = stored.texts(np.arange(len(wanted), dtype=np.int64))
    return np.array([a == b for a, b in zip(texts, wanted, strict=True)], dtype=np.bool_)
