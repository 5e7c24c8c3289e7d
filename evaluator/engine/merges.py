"""When a partition's chunks of open requests merge, and into what sizes. Pure.

A lookup searches every chunk, so their number must stay small whatever the
attribution window; a row should be copied few times. New chunks merge binary-counter
style up to :data:`SMALL_ROWS` rows, then :data:`FAN` chunks of one size into one
``FAN`` times as large, up to :data:`CHUNK_ROWS`. A merge drops the finished rows and
keeps the hashes' order (no sort); a chunk mostly finished is rewritten with its live
rows. The chunks stay in arrival order, which is nearly deadline order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from evaluator.engine.chunks import Chunk

SMALL_ROWS = 16_384
"""New rows are merged binary-counter style into chunks of up to this many."""
FAN = 8
"""Chunks of one size are merged ``FAN`` at a time into one ``FAN`` times as large."""
CHUNK_ROWS = SMALL_ROWS * FAN * FAN
"""Rows of the largest chunks (1,048,576). A partition open for 24 h at 250 requests/s
holds 21.6 million, about 21 full chunks and a few smaller ones (at 16,384 rows a
chunk, 1,300, and each lookup cost more than the rest of an event's work). Past
:data:`SMALL_ROWS` a row is copied once per size (twice in all)."""


def live_part(chunk: Chunk) -> Chunk:
    """The chunk itself if every row is live, else a copy of its live rows."""
    if chunk.live == chunk.size:
        return chunk
    return chunk.take(np.flatnonzero(chunk.alive))


def push(chunks: list[Chunk], chunk: Chunk) -> None:
    """Append a chunk with live rows to ``chunks`` (oldest first), merging as due."""
    chunks.append(chunk)
    # merge while the newer chunk is as large as the one before (amortised: each row
    # is copied a logarithmic number of times), dropping finished rows
    while len(chunks) >= 2 and chunks[-2].live <= chunks[-1].live:
        a, b = chunks[-2], chunks[-1]
        if a.live + b.live > SMALL_ROWS:
            break
        chunks[-2:] = [Chunk.concat([live_part(a), live_part(b)])]
    _gather(chunks)


def _gather(chunks: list[Chunk]) -> None:
    """Merge the newest chunks of one size, :data:`FAN` of them, into one (sizes from
    :data:`SMALL_ROWS` up to :data:`CHUNK_ROWS`)."""
    size = SMALL_ROWS
    while size < CHUNK_ROWS:
        n = 0
        for chunk in reversed(chunks):
            if not size // 2 <= chunk.live < size * FAN // 2:
                break
            n += 1
        if n >= FAN:
            chunks[-n:] = [Chunk.concat([live_part(c) for c in chunks[-n:]])]
        size *= FAN


def grouped(chunks: Iterable[Chunk]) -> Iterator[Chunk]:
    """The live rows of ``chunks`` (a new owner's load) in chunks of up to
    :data:`CHUNK_ROWS`, each row copied once; at most one chunk's worth of the input
    is held at a time."""
    group: list[Chunk] = []
    rows = 0
    for chunk in chunks:
        if not chunk.live:
            continue
        if group and rows + chunk.live > CHUNK_ROWS:
            yield _joined(group)
            group, rows = [], 0
        group.append(chunk)
        rows += chunk.live
    if group:
        yield _joined(group)


def _joined(group: list[Chunk]) -> Chunk:
    parts = [live_part(c) for c in group]
    return parts[0] if len(parts) == 1 else Chunk.concat(parts)


def compacted(chunks: list[Chunk], touched: dict[int, Chunk]) -> list[Chunk]:
    """``chunks`` without the touched ones that have no live row, and with those mostly
    finished rewritten (``touched``: by ``id``, the chunks that lost rows)."""
    kept = []
    for chunk in chunks:
        if id(chunk) not in touched or chunk.live * 4 >= chunk.size:
            kept.append(chunk)
        elif chunk.live:
            kept.append(live_part(chunk))
    return kept
