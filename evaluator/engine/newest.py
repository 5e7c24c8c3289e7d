"""The newest open requests of a partition, held as they came until they are read:
then they become one chunk of columns together. Pure.

Building a chunk has a cost per call whatever its size: the codebook's lookups, two
sorted indexes and their filters, label codes, a merge with the chunks before, and
at the checkpoint one encoded segment each. Keeping up with live traffic, a poll
brings tens of requests a partition, so that cost, paid per poll, was most of an
impression's work. Most polls read nothing of the newest requests but whether an id
is among them (a duplicate impression, an interaction naming its request): a set
answers that, and the open requests of a user are read where they are
(:meth:`Newest.of_users`). They become columns only when something reads them as
columns: a scan that may reach their times, or the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from evaluator.core.due import Ragged
from evaluator.core.tokens import Spans
from evaluator.engine.chunks import Row, list_codes, span_codes
from evaluator.engine.codebook import Codebook

_ID, _USER, _TIME = itemgetter(0), itemgetter(1), itemgetter(3)
"""A changelog request row's request id, user id and impression time."""


class Newest:
    """Rows appended since the last chunk was built (see the module docstring)."""

    __slots__ = ("_items", "_rows", "first_ms", "ids", "record", "users")

    def __init__(self) -> None:
        self._rows: list[Row] = []
        self._items: list[Spans] | None = None
        self.ids: set[str] = set()
        self.users: set[str] = set()
        self.first_ms = 0
        """The earliest impression time of the rows (meaningless without rows)."""
        self.record = False
        """Whether the chunk they become is reported as built (requests opened by the
        stream, written at the next checkpoint; not those a new owner reloads)."""

    def __len__(self) -> int:
        return len(self._rows)

    def accepts(self, items: Spans | None, record: bool) -> bool:
        """Whether rows of this kind join the held ones in one chunk: all with hashed
        item spans or all without, all reported or none (no rows: any)."""
        if not self._rows:
            return True
        return (items is None) == (self._items is None) and record == self.record

    def add(self, rows: Sequence[Row], items: Spans | None, record: bool) -> None:
        """Hold rows (of a kind :meth:`accepts`; none open already)."""
        first = min(map(_TIME, rows))
        if not self._rows:
            self._items = None if items is None else []
            self.record = record
            self.first_ms = first
        else:
            self.first_ms = min(self.first_ms, first)
        self._rows += rows
        if items is not None:
            assert self._items is not None
            self._items.append(items)
        self.ids.update(map(_ID, rows))
        self.users.update(map(_USER, rows))

    def holds(self, rids: Sequence[str]) -> npt.NDArray[np.bool_]:
        """Which of the ids are held."""
        return np.fromiter(map(self.ids.__contains__, rids), dtype=np.bool_, count=len(rids))

    def reaches(self, through_ms: int) -> bool:
        """Whether a row may have an impression time at or before ``through_ms``."""
        return bool(self._rows) and self.first_ms <= through_ms

    def has_user(self, uids: Sequence[str]) -> bool:
        return bool(self._rows) and not self.users.isdisjoint(uids)

    def of_users(self, wanted: set[str], book: Codebook) -> tuple[list[Row], Ragged]:
        """The rows of the given users, in order of arrival, and their items' codes
        (new strings added to ``book``); nothing changes in what is held."""
        at = [n for n, row in enumerate(self._rows) if row[1] in wanted]
        rows = [self._rows[n] for n in at]
        if self._items is None:
            return rows, list_codes([row[4] for row in rows], book)
        spans = Spans.concat(self._items)
        self._items = [spans]  # joined once for the reads until the next add
        return rows, span_codes(spans.take(np.asarray(at, dtype=np.int64)), book)

    def take(self) -> tuple[list[Row], Spans | None, bool]:
        """The rows held (in order of arrival), their items' spans together, and
        :attr:`record`; nothing is held after."""
        rows, items, record = self._rows, self._items, self.record
        self._rows, self._items = [], None
        self.ids, self.users = set(), set()
        return rows, None if items is None else Spans.concat(items), record


__all__ = ["Newest"]
