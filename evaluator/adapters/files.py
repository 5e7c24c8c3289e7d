"""JSON Lines files, plain or gzip-compressed, read in chunks of lines."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from evaluator.core.events import Damage

_GZIP_MAGIC = b"\x1f\x8b"


_DAMAGE = (EOFError, zlib.error)
"""What truncated or corrupt gzip data raises while being read."""


@dataclass(frozen=True, slots=True)
class LineChunk:
    """Non-blank lines of a file and their 1-based line numbers."""

    payloads: list[bytes]
    line_numbers: list[int]


def read_jsonl(
    path: str | Path,
    chunk_lines: int = 65_536,
    on_bytes: Callable[[int], object] | None = None,
    damaged: list[Damage] | None = None,
) -> Iterator[LineChunk]:
    """Yield chunks of non-blank lines; ``on_bytes`` receives the compressed bytes consumed.

    A truncated or corrupt gzip file yields every line before the damage, then stops
    and appends a :class:`Damage` to ``damaged`` (raises ``ValueError`` without it)."""
    path = Path(path)
    with open(path, "rb") as raw_handle:
        compressed = raw_handle.read(2) == _GZIP_MAGIC
        raw_handle.seek(0)
        reader: Iterator[bytes] = _gunzip_lines(raw_handle) if compressed else iter(raw_handle)
        last_pos = 0
        payloads: list[bytes] = []
        numbers: list[int] = []
        lines = reader
        number = 0
        while True:
            try:
                line = next(lines)
            except StopIteration:
                break
            except _DAMAGE as exc:
                found = Damage(str(path), number, raw_handle.tell(), str(exc) or type(exc).__name__)
                if damaged is None:
                    raise ValueError(found.describe()) from None
                damaged.append(found)
                break
            number += 1
            if line.strip():
                payloads.append(line)
                numbers.append(number)
            if len(payloads) >= chunk_lines:
                yield LineChunk(payloads, numbers)
                payloads, numbers = [], []
                last_pos = _report(raw_handle, last_pos, on_bytes)
        if payloads:
            yield LineChunk(payloads, numbers)
        _report(raw_handle, last_pos, on_bytes)


GZIP_READ = 1 << 16
"""Compressed bytes read at a time."""
GZIP_SLICE = 4096
"""Compressed bytes decompressed at a time."""


def _gunzip_lines(handle: IO[bytes]) -> Iterator[bytes]:
    """The lines of gzip data (concatenated members too), decompressed as a stream so
    that every complete line before a truncation or corruption is delivered before
    the error (``EOFError`` or ``zlib.error``); a partial last line is dropped."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending = b""
    while True:
        chunk = handle.read(GZIP_READ)
        if not chunk:
            if not decompressor.eof:
                raise EOFError("compressed file ended before the end-of-stream marker")
            if pending:
                yield pending  # a last line without a newline, checked by the trailer
            return
        while chunk:
            # small slices: a bad trailer (CRC) raises for its slice only, after the
            # lines of the slices before it were delivered
            piece, chunk = chunk[:GZIP_SLICE], chunk[GZIP_SLICE:]
            before = decompressor.copy()
            try:
                data = decompressor.decompress(piece)
            except zlib.error:  # deliver what precedes the damage in this slice, then raise
                for line in (pending + _salvage(before, piece)).split(b"\n")[:-1]:
                    yield line + b"\n"
                raise
            padded = False
            if decompressor.eof and decompressor.unused_data:  # the next gzip member
                chunk = decompressor.unused_data + chunk
                if not chunk.strip(b"\x00"):
                    chunk = _after_zeros(handle)
                    padded = not chunk  # zeros to the end: padding, as gzip allows
                if not padded:
                    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                yield line + b"\n"
            if padded:
                if pending:
                    yield pending
                return


def _after_zeros(handle: IO[bytes]) -> bytes:
    """The data after a run of zero bytes (empty when only zeros remain)."""
    while True:
        more = handle.read(GZIP_READ)
        if not more or more.strip(b"\x00"):
            return more.lstrip(b"\x00")


def _salvage(decompressor: Any, piece: bytes) -> bytes:
    """What ``piece`` decompresses to before the byte that fails."""
    out = b""
    for at in range(0, len(piece), 64):
        try:
            out += decompressor.decompress(piece[at : at + 64])
        except zlib.error:
            break
    return out


def _report(handle: IO[bytes], last: int, on_bytes: Callable[[int], object] | None) -> int:
    pos = handle.tell()
    if on_bytes is not None and pos > last:
        on_bytes(pos - last)
    return pos


def file_size(path: str | Path) -> int:
    return os.path.getsize(path)
