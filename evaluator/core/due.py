"""Requests being finalised, as columns: what finalisation reads, and what it hands on.

The partition engine's open requests are columns of codes (a chunk per batch of
impressions); finalising them reads those columns directly, with no object per
request: each list (items, attribute values, shadow ranking) is a row of a
:class:`Ragged` of integer codes into ``names``. Equal strings have equal codes,
which is all the join, diversity and overlap compare. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]
ItemKey = str | int
"""An item id, or its code (the partition engine keeps items as codes)."""


@dataclass(slots=True)
class Ragged:
    """Variable-length rows in one flat array: row i is ``flat[off[i]:off[i + 1]]``."""

    flat: npt.NDArray[Any]
    off: I32
    """Row bounds (``int32``: far fewer than 2**31 values)."""

    @classmethod
    def of(cls, flat: npt.NDArray[Any], lengths: Sequence[int] | npt.NDArray[Any]) -> Ragged:
        off = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        return cls(flat, off.astype(np.int32))

    @classmethod
    def of_lists(cls, lists: Sequence[Sequence[int]]) -> Ragged:
        """Integer lists as one ragged array."""
        flat = np.fromiter((v for row in lists for v in row), dtype=np.int64)
        return cls.of(flat, [len(row) for row in lists])

    @property
    def rows_count(self) -> int:
        return int(self.off.size) - 1

    def lengths(self) -> I64:
        return np.diff(self.off).astype(np.int64)

    def row_of(self) -> I64:
        """The row of each flat value."""
        return np.repeat(np.arange(self.rows_count, dtype=np.int64), self.lengths())

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

    def lists(self) -> list[list[Any]]:
        """Every row as a Python list."""
        values, bounds = self.flat.tolist(), self.off.tolist()
        return [values[a:b] for a, b in pairwise(bounds)]

    def texts(self, rows: I64) -> list[str]:
        """The given rows of UTF-8 bytes, decoded."""
        part = self.take(rows)
        raw, bounds = part.flat.tobytes(), part.off.tolist()
        if raw.isascii():  # one decode; a character is a byte
            text = raw.decode()
            return [text[a:b] for a, b in pairwise(bounds)]
        return [raw[a:b].decode() for a, b in pairwise(bounds)]

    def top(self, k: int) -> I64:
        """The first ``k`` values of each row as a matrix ``(rows, min(k, longest))``,
        ``-1`` padded."""
        lengths = np.minimum(self.lengths(), k)
        codes = np.full((self.rows_count, int(lengths.max(initial=0))), -1, dtype=np.int64)
        if codes.size:
            rank = np.arange(self.flat.size) - np.repeat(self.off[:-1], self.lengths())
            kept = rank < k
            codes[self.row_of()[kept], rank[kept]] = self.flat[kept]
        return codes

    def positions(self, rows: I64, values: I64) -> I64:
        """The 0-based position of ``values[i]`` in row ``rows[i]`` (its first, as
        ``list.index``), -1 where it is absent. Values are non-negative codes (a
        negative one is absent everywhere). Each value is compared with its own row
        (a gather of the rows' values, padded to the longest), unless those rows hold
        more values than the whole array: then one sort and one binary search."""
        out = np.full(rows.size, -1, dtype=np.int64)
        if not rows.size or not self.flat.size:
            return out
        wanted = np.flatnonzero((values >= 0) & (rows >= 0))
        starts = self.off[rows[wanted]].astype(np.int64)
        lengths = self.off[rows[wanted] + 1] - starts
        width = int(lengths.max(initial=0))
        if width * wanted.size > 2 * self.flat.size:
            return self._sorted_positions(rows, values)
        column = np.arange(width)
        at = np.minimum(starts[:, None] + column, self.flat.size - 1)
        match = (self.flat[at] == values[wanted, None]) & (column < lengths[:, None])
        first = match.argmax(axis=1) if width else np.zeros(wanted.size, dtype=np.int64)
        found = match[np.arange(wanted.size), first] if width else first.astype(np.bool_)
        out[wanted[found]] = first[found]
        return out

    def _sorted_positions(self, rows: I64, values: I64) -> I64:
        """:meth:`positions` by one sort of every value (rows and values as there)."""
        out = np.full(rows.size, -1, dtype=np.int64)
        flat = self.flat.astype(np.int64)
        width = int(max(int(flat.max()), int(values.max(initial=0)))) + 1
        row_of = self.row_of()
        keys = row_of * width + flat
        order = np.argsort(keys, kind="stable")  # equal keys keep their order: first wins
        ordered = keys[order]
        wanted = rows * width + values
        at = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
        hit = (values >= 0) & (rows >= 0) & (ordered[at] == wanted)
        out[hit] = order[at[hit]] - self.off[rows[hit]]
        return out

    @staticmethod
    def concat(parts: Sequence[Ragged]) -> Ragged:
        shift = np.cumsum([0] + [int(p.off[-1]) for p in parts[:-1]])
        off = np.concatenate([[0]] + [p.off[1:] + s for p, s in zip(parts, shift, strict=True)])
        return Ragged(np.concatenate([p.flat for p in parts]), off.astype(np.int32))


class Named(NamedTuple):
    """Interactions naming the requests being finalised, as columns: each one's request
    row, event id, item code (-1: not among ``names``), time and grade."""

    row: I64
    event_id: list[str]
    item: I64
    ms: I64
    grade: FloatArray

    @staticmethod
    def none() -> Named:
        return Named(
            np.zeros(0, np.int64), [], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        )


@dataclass(slots=True)
class Due:
    """Requests being finalised, as columns (row i is request i); lists are codes of
    the strings ``names`` (see the module docstring)."""

    request_id: list[str]
    user_id: list[str]
    variant: list[str]
    ms: I64
    items: Ragged
    attributes: Ragged
    """Values of the diversity attribute, parallel to ``items`` (a row may be empty)."""
    shadow_variant: list[str]
    shadow: Ragged
    """The ranking ``shadow_variant`` would have shown (empty: none)."""
    context: list[str]
    randomization: list[tuple[str, int] | None]
    named: Named = field(default_factory=Named.none)
    draft: list[str] | None = None
    """Each interleaved list's draft ("" for the others); None: none is interleaved."""

    def __len__(self) -> int:
        return len(self.request_id)

    @staticmethod
    def concat(parts: Sequence[Due]) -> Due:
        """Requests without interactions, one part after another (none: no request)."""
        if len(parts) == 1:
            return parts[0]
        empty = Ragged(np.zeros(0, np.int64), np.zeros(1, np.int32))

        def joined(name: str) -> list[Any]:
            return [v for p in parts for v in getattr(p, name)]

        def ragged(name: str) -> Ragged:
            return Ragged.concat([getattr(p, name) for p in parts]) if parts else empty

        return Due(
            joined("request_id"),
            joined("user_id"),
            joined("variant"),
            np.concatenate([p.ms for p in parts]) if parts else np.zeros(0, np.int64),
            ragged("items"),
            ragged("attributes"),
            joined("shadow_variant"),
            ragged("shadow"),
            joined("context"),
            joined("randomization"),
            draft=_drafts(parts),
        )

    def take(self, rows: I64) -> Due:
        """The given rows (an index array, in order), with their interactions."""
        pick = rows.tolist()
        new_row = np.full(len(self), -1, dtype=np.int64)
        new_row[rows] = np.arange(rows.size)
        named = self.named
        keep = np.flatnonzero(new_row[named.row] >= 0)
        return Due(
            [self.request_id[i] for i in pick],
            [self.user_id[i] for i in pick],
            [self.variant[i] for i in pick],
            self.ms[rows],
            self.items.take(rows),
            self.attributes.take(rows),
            [self.shadow_variant[i] for i in pick],
            self.shadow.take(rows),
            [self.context[i] for i in pick],
            [self.randomization[i] for i in pick],
            Named(
                new_row[named.row[keep]],
                [named.event_id[i] for i in keep.tolist()],
                named.item[keep],
                named.ms[keep],
                named.grade[keep],
            ),
            None if self.draft is None else [self.draft[i] for i in pick],
        )

    def drafts(self) -> list[str]:
        """Each request's draft ("": not interleaved)."""
        return [""] * len(self) if self.draft is None else self.draft


def _drafts(parts: Sequence[Due]) -> list[str] | None:
    if all(p.draft is None for p in parts):
        return None
    return [d for p in parts for d in p.drafts()]


def time_order(ms: I64, request_ids: Sequence[str]) -> I64 | None:
    """The order of (time, request id) as an index array; None when already in it."""
    if ms.size < 2:
        return None
    if (np.diff(ms) > 0).all():
        return None
    order = np.argsort(ms, kind="stable")
    if (np.diff(ms[order]) == 0).any():  # ties: by request id, in code point order as str
        order = np.lexsort((np.array(request_ids), ms))
    return None if (order == np.arange(ms.size)).all() else order


class PendingInteraction(NamedTuple):
    """A stored interaction waiting for its request(s) to finalise."""

    event_id: str
    item_id: ItemKey
    timestamp_ms: int
    grade: float


@dataclass(slots=True)
class OpenRequest:
    """A stored impression and the interactions that named its request id: one
    request as an object (tests, the embedded store's readers, single lookups)."""

    request_id: str
    user_id: str
    variant: str
    timestamp_ms: int
    items: Sequence[ItemKey]
    """Item ids, or their codes in the partition's codebook."""
    interactions: Sequence[PendingInteraction] = ()
    """Set when the request is closed; the shared empty tuple until then (no empty
    list per open request: a lot of them are held)."""
    attributes: Sequence[ItemKey] = ()
    """Values of the diversity attribute, parallel to ``items`` (may be empty)."""
    shadow_variant: str = ""
    shadow: Sequence[ItemKey] = ()
    """The ranking ``shadow_variant`` would have shown (empty: none)."""
    context: str = ""
    randomization: tuple[str, int] | None = None
    """``("topn", n)`` or ``("swap", k)`` when the list was randomised."""
    draft: str = ""
    """An interleaved list's draft (:func:`evaluator.core.ab.interleaving.draft`); "": none."""


def due_of(requests: Sequence[OpenRequest]) -> tuple[Due, list[str]]:
    """Request objects (items as strings) as columns, and the strings coded."""
    code = Coder()
    named = [(row, it) for row, r in enumerate(requests) for it in r.interactions]
    due = Due(
        [r.request_id for r in requests],
        [r.user_id for r in requests],
        [r.variant for r in requests],
        np.array([r.timestamp_ms for r in requests], dtype=np.int64),
        Ragged.of_lists([code(map(str, r.items)) for r in requests]),
        Ragged.of_lists([code(map(str, r.attributes)) for r in requests]),
        [r.shadow_variant for r in requests],
        Ragged.of_lists([code(map(str, r.shadow)) for r in requests]),
        [r.context for r in requests],
        [r.randomization for r in requests],
        Named(
            np.array([row for row, _ in named], dtype=np.int64),
            [it.event_id for _, it in named],
            np.array(code(str(it.item_id) for _, it in named), dtype=np.int64),
            np.array([it.timestamp_ms for _, it in named], dtype=np.int64),
            np.array([it.grade for _, it in named], dtype=np.float64),
        ),
        [r.draft for r in requests] if any(r.draft for r in requests) else None,
    )
    return due, code.names


def requests_of(due: Due, names: Sequence[str] | None) -> list[OpenRequest]:
    """The requests as objects, with the interactions that named them (lists decoded
    through ``names``; None: left as codes)."""
    decode = tuple if names is None else (lambda row: tuple(names[c] for c in row))
    named: list[list[PendingInteraction]] = [[] for _ in range(len(due))]
    n = due.named
    for row, eid, item, t, g in zip(
        n.row.tolist(), n.event_id, n.item.tolist(), n.ms.tolist(), n.grade.tolist(), strict=True
    ):
        item_id: ItemKey = item if names is None else names[item] if item >= 0 else ""
        named[row].append(PendingInteraction(eid, item_id, t, g))
    return [
        OpenRequest(
            rid,
            uid,
            variant,
            ms,
            decode(items),
            its or (),
            decode(attrs),
            sv,
            decode(sh),
            ctx,
            rnd,
            draft,
        )
        for rid, uid, variant, ms, items, its, attrs, sv, sh, ctx, rnd, draft in zip(
            due.request_id,
            due.user_id,
            due.variant,
            due.ms.tolist(),
            due.items.lists(),
            named,
            due.attributes.lists(),
            due.shadow_variant,
            due.shadow.lists(),
            due.context,
            due.randomization,
            due.drafts(),
            strict=True,
        )
    ]


class Coder:
    """Strings to codes in first-seen order (:meth:`Due.of`'s codebook)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def __call__(self, values: Iterable[str]) -> list[int]:
        codes = self.codes
        return [codes.setdefault(v, len(codes)) for v in values]

    @property
    def names(self) -> list[str]:
        return list(self.codes)
