"""JSON Lines files, plain or gzip-compressed, read in chunks of lines."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class LineChunk:
    """Non-blank lines of a file and their 1-based line numbers."""

    payloads: list[bytes]
    line_numbers: list[int]


def read_jsonl(
    path: str | Path,
    chunk_lines: int = 65_536,
    on_bytes: Callable[[int], object] | None = None,
) -> Iterator[LineChunk]:
    """Yield chunks of non-blank lines; ``on_bytes`` receives the compressed bytes consumed."""
    path = Path(path)
    with open(path, "rb") as raw_handle:
        compressed = raw_handle.read(2) == _GZIP_MAGIC
        raw_handle.seek(0)
        reader: IO[bytes] = (
            gzip.GzipFile(fileobj=raw_handle) if compressed else raw_handle  # type: ignore[assignment]
        )
        last_pos = 0
        payloads: list[bytes] = []
        numbers: list[int] = []
        for number, line in enumerate(reader, start=1):
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


def _report(handle: IO[bytes], last: int, on_bytes: Callable[[int], object] | None) -> int:
    pos = handle.tell()
    if on_bytes is not None and pos > last:
        on_bytes(pos - last)
    return pos


def file_size(path: str | Path) -> int:
    return os.path.getsize(path)
