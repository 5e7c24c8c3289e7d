"""Strings as spans of one byte buffer, found and hashed a poll at a time. Pure.

An impression's item ids are most of its bytes and most of its decoding: a Python
string each, hashed again to be coded. Here the items of a whole poll are located in
the payloads' JSON by a few array passes (quote positions, bracket and separator
checks, no Python per item) and hashed 8 bytes at a time over all of them at once;
only the ids the partition has never seen become strings. A list that is not a plain
array of strings without escapes (a backslash, a number, a nested array) takes the
ordinary path: decoded by msgspec and its strings encoded back to UTF-8, so every
list ends up as spans of one buffer, whatever its JSON spelling.

The hash (:func:`hash_spans`) is keyed by a seed: per word, xor, multiply by an odd
constant and fold the high bits down, each step a bijection of 64 bits; equal
strings hash alike, and strings of at most 8 bytes and equal length never collide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Bools = npt.NDArray[np.bool_]

PAD = 8
"""Zero bytes after the last span: a word read at any span's start stays in bounds."""
_MULTIPLY = np.uint64(0x9E3779B97F4A7C15)
_LENGTH = np.uint64(0xC2B2AE3D27D4EB4F)
_FINAL = np.uint64(0xFF51AFD7ED558CCD)
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=np.uint64)
"""The low ``k`` bytes of a little-endian word (``k`` = 0..8)."""
_QUOTE, _OPEN = ord('"'), ord("[")
_COMMA = ord(",")
_BLANK = np.zeros(256, dtype=np.bool_)
_BLANK[[ord(c) for c in "\t\n\r "]] = True
_ALLOWED = np.tile(_BLANK, 3)
_ALLOWED[ord("[")] = _ALLOWED[256 + _COMMA] = _ALLOWED[512 + ord("]")] = True
_ALLOWED[512 + ord("[")] = True  # an empty array is all tail: "[]"
"""Bytes allowed before the first string (0..255), between two (256..511) and after the
last (512..767)."""


class Spans(NamedTuple):
    """Strings as spans of ``buf`` (followed by :data:`PAD` zero bytes), grouped by
    owner: owner ``i`` holds spans ``off[i]:off[i + 1]``."""

    buf: U8
    start: I64
    length: I64
    off: I64
    key: I64 | None = None
    """Each span's hash (:func:`hash_spans`), once computed (:meth:`hashed`)."""

    def hashed(self, seed: int) -> Spans:
        """These spans with their keys."""
        return self._replace(key=hash_spans(self, seed))

    def counts(self) -> I64:
        """Spans per owner."""
        return np.diff(self.off)

    def texts(self, spans: I64) -> list[str]:
        """The given spans as strings."""
        data = self.buf.tobytes()
        return [
            data[a : a + n].decode()
            for a, n in zip(self.start[spans].tolist(), self.length[spans].tolist(), strict=True)
        ]

    def take(self, owners: I64) -> Spans:
        """The spans of the given owners (an index array, in order)."""
        first = self.off[owners]
        counts = self.off[owners + 1] - first
        off = np.zeros(owners.size + 1, dtype=np.int64)
        np.cumsum(counts, out=off[1:])
        index = np.repeat(first - off[:-1], counts) + np.arange(off[-1], dtype=np.int64)
        key = None if self.key is None else self.key[index]
        return Spans(self.buf, self.start[index], self.length[index], off, key)

    @staticmethod
    def concat(parts: Sequence[Spans]) -> Spans:
        """The owners of several spans one after another, in one buffer (keys kept when
        every part has them)."""
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [p.buf.size for p in parts[:-1]])
        counts = np.concatenate([np.diff(p.off) for p in parts])
        keys = [p.key for p in parts]
        return Spans(
            np.concatenate([p.buf for p in parts]),
            np.concatenate([p.start + shift for p, shift in zip(parts, shifts, strict=True)]),
            np.concatenate([p.length for p in parts]),
            _offsets(counts),
            None if any(k is None for k in keys) else np.concatenate(keys),  # type: ignore[arg-type]
        )


def hash_spans(spans: Spans, seed: int) -> I64:
    """A 64-bit keyed hash of each span's bytes (see the module docstring)."""
    buf, start, length = spans.buf, spans.start, spans.length
    n = start.size
    # every byte offset as the start of a little-endian word (unaligned reads)
    words = np.ndarray((max(buf.size - 7, 0),), dtype="<u8", buffer=buf.data, strides=(1,))
    h = np.uint64(seed) ^ (length.astype(np.uint64) * _LENGTH)
    rows = np.arange(n)
    at = start
    left = length
    while rows.size:
        word = words[at] & _MASKS[np.minimum(left, 8)]
        mixed = (h[rows] ^ word) * _MULTIPLY
        h[rows] = mixed ^ (mixed >> np.uint64(29))
        more = left > 8
        rows, at, left = rows[more], at[more] + 8, left[more] - 8
    h = (h ^ (h >> np.uint64(33))) * _FINAL
    return (h ^ (h >> np.uint64(33))).view(np.int64)


def string_spans(strings: Sequence[str]) -> Spans:
    """Strings as spans (one owner each) of their UTF-8 bytes."""
    raw = [s.encode() for s in strings]
    length = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
    start = np.zeros(len(raw), dtype=np.int64)
    np.cumsum(length[:-1], out=start[1:])
    buf = np.frombuffer(b"".join(raw) + bytes(PAD), dtype=np.uint8)
    return Spans(buf, start, length, np.arange(len(raw) + 1, dtype=np.int64))


def array_spans(arrays: Sequence[bytes]) -> tuple[Spans, Bools]:
    """The strings of JSON arrays of strings (each valid JSON), as spans of their
    bytes, owner ``i`` for array ``i``; also which arrays qualified. One that does not
    (an escape, a non-string element, a nested array, bytes that are not UTF-8) has no
    spans: the caller decodes it (:func:`with_strings`). Array passes over the quotes
    and the bytes between strings; three over all the bytes."""
    n = len(arrays)
    joined = b"".join(arrays)
    if b"\\" in joined:  # escapes: those arrays are left to the caller
        plain = [i for i, a in enumerate(arrays) if b"\\" not in bytes(a)]
        spans, ok = array_spans([arrays[i] for i in plain])
        counts = np.zeros(n, dtype=np.int64)
        counts[plain] = spans.counts()
        everywhere = np.zeros(n, dtype=np.bool_)
        everywhere[plain] = ok
        return spans._replace(off=_offsets(counts)), everywhere
    bounds = _offsets(np.fromiter(map(len, arrays), dtype=np.int64, count=n))
    buf = np.frombuffer(joined + bytes(PAD), dtype=np.uint8)
    body = buf[: bounds[-1]]
    # no escape: every quote opens or closes a string, and each array holds an even
    # number of them, so they pair up in order over the whole batch
    quotes = np.flatnonzero(body == _QUOTE)
    opening, closing = quotes[0::2], quotes[1::2]
    counts = np.diff(np.searchsorted(opening, bounds))
    ok = _syntax_ok(body, bounds, opening, closing, counts)
    if body.size and body.max() >= 0x80 and not _utf8(joined):  # as msgspec requires
        for i in np.flatnonzero(ok).tolist():  # which arrays are not UTF-8
            try:
                bytes(arrays[i]).decode()
            except UnicodeDecodeError:
                ok[i] = False
    kept = np.repeat(ok, counts)
    counts[~ok] = 0
    start = opening[kept] + 1
    return Spans(buf, start, closing[kept] - start, _offsets(counts)), ok


def _utf8(data: bytes) -> bool:
    """Whether the bytes are UTF-8 (for joined JSON values: each starts and ends with an
    ASCII byte, so no sequence spans two, and the whole is UTF-8 exactly when each is)."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _offsets(counts: I64) -> I64:
    off = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return off


def _syntax_ok(body: U8, bounds: I64, opening: I64, closing: I64, counts: I64) -> Bools:
    """Whether each array's bytes outside its strings are those of a flat array of
    strings: ``[`` and blanks before the first, a comma and blanks between two, blanks
    and ``]`` after the last (the JSON is valid, so nothing else can be missing). The
    usual separators (``,`` and ``, ``) are checked directly, others byte by byte."""
    n = counts.size
    first = bounds[:-1]
    has = counts > 0
    at_first = np.searchsorted(opening, first)  # each array's first string
    padded_open, padded_close = np.append(opening, 0), np.append(closing, 0)
    head_end = np.where(has, padded_open[at_first], first)
    tail_start = np.where(has, padded_close[np.maximum(at_first + counts - 1, 0)] + 1, first)
    owner = np.repeat(np.arange(n), counts)
    between = np.flatnonzero(owner[:-1] == owner[1:])  # string j and j + 1 of one array
    after, before = closing[between] + 1, opening[between + 1]
    size = before - after
    b1, b2 = body[after], body[np.minimum(after + 1, body.size - 1)]
    plain = ((size == 1) & (b1 == _COMMA)) | (
        (size == 2) & (((b1 == _COMMA) & _BLANK[b2]) | (_BLANK[b1] & (b2 == _COMMA)))
    )
    odd = np.flatnonzero(~plain)
    starts = np.concatenate([first, after[odd], tail_start])
    ends = np.concatenate([head_end, before[odd], bounds[1:]])
    which = np.concatenate([np.arange(n), owner[between[odd]], np.arange(n)])
    kind = np.repeat(np.arange(3) * 256, [n, odd.size, n])
    lengths = ends - starts
    gap_of = np.repeat(np.arange(lengths.size), lengths)
    index = np.arange(gap_of.size) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    gap = body[index]
    ok = np.ones(n, dtype=np.bool_)
    ok[which[gap_of[~_ALLOWED[kind[gap_of] + gap]]]] = False
    ok &= np.bincount(which[gap_of[gap == _OPEN]], minlength=n) == 1
    return ok


def with_strings(spans: Spans, lists: Mapping[int, Sequence[str]]) -> Spans:
    """``spans`` with the given owners' spans replaced by strings (owner -> its strings:
    the lists :func:`array_spans` left to the caller)."""
    if not lists:
        return spans
    extra = [s.encode() for i in sorted(lists) for s in lists[i]]
    counts = spans.counts()
    for i, strings in lists.items():
        counts[i] = len(strings)
    base = spans.buf.size - PAD
    buf = np.frombuffer(spans.buf[:base].tobytes() + b"".join(extra) + bytes(PAD), np.uint8)
    length = np.fromiter(map(len, extra), dtype=np.int64, count=len(extra))
    start = base + np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    owners = np.repeat(
        np.array(sorted(lists), dtype=np.int64), [len(lists[i]) for i in sorted(lists)]
    )
    old_owner = np.repeat(np.arange(counts.size), spans.counts())
    owner = np.concatenate([old_owner, owners])
    order = np.argsort(owner, kind="stable")
    off = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return Spans(
        buf,
        np.concatenate([spans.start, start])[order],
        np.concatenate([spans.length, length])[order],
        off,
    )


def repeated(spans: Spans, keys: I64) -> Bools:
    """Whether each owner holds two spans of equal key (a repeated string). One sort
    of the keys offset by their owner (an odd multiple: equal only within an owner,
    but for a 64-bit coincidence); the owners are found only when some key repeats."""
    counts = spans.counts()
    out = np.zeros(counts.size, dtype=np.bool_)
    if keys.size < 2:
        return out
    owner = np.repeat(np.arange(counts.size, dtype=np.uint64), counts)
    mixed = keys.view(np.uint64) + owner * _MULTIPLY
    ordered = np.sort(mixed)
    if not (ordered[1:] == ordered[:-1]).any():
        return out
    order = np.argsort(mixed, kind="stable")
    same = np.flatnonzero(mixed[order][1:] == mixed[order][:-1])
    out[owner[order[same]].astype(np.int64)] = True
    return out
