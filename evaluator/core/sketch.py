"""A mergeable HyperLogLog distinct-count sketch with vectorised, stable string hashing.

Used for catalog coverage over sets too large to hold exactly. Hashes are stable
across processes and batches (FNV-1a over code points, then a 64-bit finaliser),
so register arrays from different instances merge with an element-wise maximum.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def _fmix64(h: U64) -> U64:
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def byte_columns(
    data: bytes, lengths: npt.NDArray[np.int64]
) -> Iterator[tuple[npt.NDArray[np.intp], npt.NDArray[np.uint64]]]:
    """Keys laid end to end in ``data`` (``lengths`` bytes each), grouped by length: per
    length, the keys' indexes and their bytes as a (length, keys) array (row i: every
    key's byte i), for hashing many keys one byte position at a time."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    for length in np.flatnonzero(np.bincount(lengths)).tolist():
        rows = np.flatnonzero(lengths == length)
        yield rows, buffer[np.arange(length)[:, None] + starts[rows]].astype(np.uint64)


def hash_strings(values: Sequence[str], seed: int = 0) -> U64:
    """Stable 64-bit hashes of strings, vectorised over the batch (loops over characters):
    FNV-1a over the code points, then :func:`_fmix64`. ``seed`` (64 bits) changes the
    starting state: hashes of a secret seed cannot be made to collide on purpose."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.uint64)
    basis = _FNV_OFFSET ^ np.uint64(seed)
    joined = "".join(values)
    if not joined.isascii():
        return _hash_code_points(values, basis)
    # ASCII: one byte per code point, gathered from one buffer per group of equal length
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    out = np.empty(len(values), dtype=np.uint64)
    for rows, chars in byte_columns(joined.encode("ascii"), lengths):
        h = np.full(len(rows), basis, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for column in chars:
                h ^= column
                h *= _FNV_PRIME
        out[rows] = h
    with np.errstate(over="ignore"):
        return _fmix64(out)


def _hash_code_points(values: Sequence[str], basis: np.uint64) -> U64:
    """:func:`hash_strings` for any strings, through a fixed-width UCS-4 array."""
    arr = np.asarray(values, dtype=np.str_)
    width = arr.dtype.itemsize // 4
    codes = arr.view(np.uint32).reshape(len(arr), width).astype(np.uint64)
    # the true lengths: a fixed-width array cannot tell trailing U+0000 from padding
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    h = np.full(len(arr), basis, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in range(width):
            stepped = (h ^ codes[:, col]) * _FNV_PRIME
            h = np.where(col < lengths, stepped, h)
        return _fmix64(h)


def _leading_zeros(x: U64) -> npt.NDArray[np.int64]:
    """Count of leading zero bits of each 64-bit value (64 for zero), exactly."""
    n = np.zeros(x.shape, dtype=np.int64)
    x = x.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        empty = (x >> np.uint64(64 - shift)) == 0
        n += np.where(empty, shift, 0)
        x = np.where(empty, x << np.uint64(shift), x)
    n += (x == 0).astype(np.int64)
    return n


class HyperLogLog:
    """HyperLogLog with 2**precision one-byte registers (precision 14: about 0.8% error)."""

    def __init__(self, precision: int = 14, registers: npt.NDArray[np.uint8] | None = None):
        if not 4 <= precision <= 18:
            raise ValueError("HyperLogLog precision must be in 4..18")
        self.precision = precision
        size = 1 << precision
        if registers is None:
            registers = np.zeros(size, dtype=np.uint8)
        elif registers.shape != (size,):
            raise ValueError("register array does not match the precision")
        self.registers = registers

    def add_hashes(self, hashes: U64) -> None:
        """Add pre-hashed values (see :func:`hash_strings`)."""
        if hashes.size == 0:
            return
        p = self.precision
        index = (hashes >> np.uint64(64 - p)).astype(np.intp)
        rest = hashes << np.uint64(p)
        rank = np.minimum(_leading_zeros(rest) + 1, 64 - p + 1).astype(np.uint8)
        np.maximum.at(self.registers, index, rank)

    def add(self, values: Sequence[str]) -> None:
        self.add_hashes(hash_strings(values))

    def merge(self, other: HyperLogLog) -> None:
        """Union with another sketch of the same precision."""
        if other.precision != self.precision:
            raise ValueError("cannot merge sketches of different precision")
        np.maximum(self.registers, other.registers, out=self.registers)

    def count(self) -> float:
        """Estimated number of distinct values added."""
        m = float(self.registers.size)
        alpha = 0.7213 / (1.0 + 1.079 / m)
        estimate = alpha * m * m / float(np.sum(np.exp2(-self.registers.astype(np.float64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if estimate <= 2.5 * m and zeros:
            return m * float(np.log(m / zeros))
        return estimate
