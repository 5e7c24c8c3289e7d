"""A column of ids that are all one prefix and a canonical lowercase UUID (what most
producers send as request ids), held as the prefix and 16 bytes an id: a chunk's
request ids then take 16 bytes each instead of 36 or more and a row bound. Pure.

:class:`UuidIds` answers what a chunk asks of an id column (:meth:`take`,
:meth:`texts`, :meth:`lengths`, the bytes as ``flat`` and ``off``) exactly as the
:class:`~evaluator.core.due.Ragged` of the same ids would; :func:`compact` finds the
columns that can be held so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluator.core.due import Ragged

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
DASHES = [8, 13, 18, 23]
"""Where a canonical UUID's dashes are (of its 36 characters)."""
_DIGITS = np.array([k for k in range(36) if k not in DASHES])
"""Where its 32 hexadecimal digits are."""
_HEX = np.frombuffer(bytes(range(256)).hex().encode(), dtype=np.uint8).reshape(256, 2)
"""Each byte's two lowercase hexadecimal digits (ASCII)."""


@dataclass(slots=True)
class UuidIds:
    """Ids that are ``prefix`` and a canonical lowercase UUID, as the UUIDs' bytes."""

    prefix: bytes
    raw: U8
    """The UUIDs' 16 bytes, a row each: shape ``(ids, 16)``."""

    @property
    def rows_count(self) -> int:
        return int(self.raw.shape[0])

    @property
    def width(self) -> int:
        """Each id's length in UTF-8 bytes."""
        return len(self.prefix) + 36

    def lengths(self) -> I64:
        return np.full(self.rows_count, self.width, dtype=np.int64)

    def take(self, rows: I64) -> UuidIds:
        return UuidIds(self.prefix, self.raw[rows])

    def chars(self) -> U8:
        """The ids' UTF-8 bytes, a row each: shape ``(ids, width)``."""
        start = len(self.prefix)
        out = np.empty((self.rows_count, start + 36), dtype=np.uint8)
        out[:, :start] = np.frombuffer(self.prefix, dtype=np.uint8)
        uuid = out[:, start:]
        uuid[:, DASHES] = ord("-")
        uuid[:, _DIGITS] = _HEX[self.raw].reshape(self.rows_count, 32)
        return out

    @property
    def flat(self) -> U8:
        """The ids' UTF-8 bytes end to end, as a ragged column holds them (made anew)."""
        return self.chars().reshape(-1)

    @property
    def off(self) -> npt.NDArray[np.int32]:
        return (np.arange(self.rows_count + 1, dtype=np.int64) * self.width).astype(np.int32)

    def texts(self, rows: I64) -> list[str]:
        """The given rows' ids."""
        if not rows.size:
            return []
        data, width = self.take(rows).chars().tobytes(), self.width
        if self.prefix.isascii():  # one decode; a character is a byte
            text = data.decode()
            return [text[a : a + width] for a in range(0, len(text), width)]
        return [data[a : a + width].decode() for a in range(0, len(data), width)]

    def ragged(self) -> Ragged:
        return Ragged(self.flat, self.off)


IdColumn = Ragged | UuidIds
"""A chunk's request or user ids."""


def compact(part: Ragged) -> IdColumn:
    """The ids as :class:`UuidIds` when every one is a common prefix and a canonical
    lowercase UUID, else as they are."""
    n = part.off.size - 1
    width = int(part.off[1]) if n else 0
    if width < 36 or part.flat.size != width * n or not bool((np.diff(part.off) == width).all()):
        return part
    chars = part.flat.reshape(n, width)
    head, tail = chars[:, : width - 36], chars[:, width - 36 :]
    if not bool((head == head[0]).all()) or not bool((tail[:, DASHES] == ord("-")).all()):
        return part
    digits = tail[:, _DIGITS]
    numeric = (digits >= ord("0")) & (digits <= ord("9"))
    if not bool((numeric | ((digits >= ord("a")) & (digits <= ord("f")))).all()):
        return part
    raw = np.frombuffer(bytes.fromhex(digits.tobytes().decode()), dtype=np.uint8)
    return UuidIds(head[0].tobytes(), raw.reshape(n, 16))


def concat(parts: Sequence[IdColumn]) -> IdColumn:
    """Id columns end to end: UUIDs of one prefix stay so, others become bytes."""
    uuids = [p for p in parts if isinstance(p, UuidIds)]
    if uuids and len(uuids) == len(parts) and all(p.prefix == uuids[0].prefix for p in uuids):
        return UuidIds(uuids[0].prefix, np.concatenate([p.raw for p in uuids]))
    return Ragged.concat([p.ragged() if isinstance(p, UuidIds) else p for p in parts])


def arrays(part: IdColumn) -> list[npt.NDArray[Any]]:
    """The arrays an id column holds."""
    return [part.raw] if isinstance(part, UuidIds) else [part.flat, part.off]
