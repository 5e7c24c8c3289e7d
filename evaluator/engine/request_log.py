"""How a partition's open requests go to its changelog: column segments and the
codebook they are coded with. Pure.

``t:<n>`` holds, as columns (:func:`~evaluator.engine.segments.encode_segment`),
the requests opened between two checkpoints and still open at the second; it is
deleted once the watermark has passed every deadline in it. ``c:<n>`` holds the
codebook's strings added since the previous ``c:`` field, so the concatenation of
the ``c:`` fields in order is the codebook a new owner decodes by. When the
codebook is rebuilt (a churning catalog, see :class:`~evaluator.engine.columns.OpenTable`)
every code changes: the ``c:`` fields and every request segment are rewritten in
the same checkpoint. Versions before column segments wrote ``s:<n>`` (rows of
strings); they are still read, and rewritten as ``t:`` at the next rebuild.
"""

from __future__ import annotations

import heapq
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from evaluator.engine.chunks import Chunk
from evaluator.engine.columns import OpenTable
from evaluator.engine.records import encode, request_row
from evaluator.engine.segments import encode_segment

Changes = dict[str, bytes | None]


class RequestLog(Protocol):
    """What these functions read and keep of a partition's state
    (:class:`~evaluator.engine.state.PartitionState`)."""

    requests: OpenTable
    fresh: set[str]
    fresh_chunks: list[Chunk]
    legacy: set[str]
    segments: list[tuple[int, str]]
    next_segment: int
    segment_rows: int
    book_written: int
    book_fields: list[str]
    next_book: int
    delay_ms: int
    finalised_ms: int | None
    judged_delay_ms: int | None


def write_fresh(state: RequestLog, out: Changes) -> None:
    """The requests opened since the last flush and still open: segments of at most
    :attr:`~RequestLog.segment_rows` rows, except those already due (opened behind
    the finalisation, not yet finalised), one ``r:`` field each."""
    chunks = state.fresh_chunks
    if len(state.fresh) == sum(chunk.size for chunk in chunks):  # none finished since
        for chunk in chunks:
            _write_rows(state, chunk, np.arange(chunk.size), out)
        return
    # the rows still open: a request finished and opened again since (its marker
    # expired) is in the set once, as its latest row
    kept, seen = [], set()
    for chunk in reversed(chunks):
        ids = chunk.ids.texts(np.arange(chunk.size))
        keep = np.zeros(chunk.size, dtype=bool)
        for row in range(chunk.size - 1, -1, -1):
            rid = ids[row]
            if rid in state.fresh and rid not in seen:
                seen.add(rid)
                keep[row] = True
        kept.append((chunk, np.flatnonzero(keep)))
    for chunk, rows in reversed(kept):
        _write_rows(state, chunk, rows, out)


def rewrite(state: RequestLog, out: Changes) -> None:
    """After the codebook was rebuilt: every request segment and ``c:`` field is
    replaced by ones in the new codes (requests stored as ``r:`` fields stay)."""
    kept = []
    for entry in state.segments:
        if entry[1][0] in "st":
            out[entry[1]] = None
        else:
            kept.append(entry)
    heapq.heapify(kept)
    state.segments = kept
    for name in state.book_fields:
        out[name] = None
    state.book_fields, state.book_written = [], 0
    legacy = state.legacy
    for chunk in state.requests.chunks:
        live = chunk.alive
        if legacy:
            ids = chunk.ids.texts(np.arange(chunk.size))
            live = live & ~np.fromiter(map(legacy.__contains__, ids), bool, len(ids))
        _write_rows(state, chunk, np.flatnonzero(live), out)
    state.requests.recoded = False


def write_book(state: RequestLog, out: Changes) -> None:
    """The codebook's strings added since the last ``c:`` field, as a new one."""
    strings = state.requests.book.strings
    if len(strings) > state.book_written:
        name = f"c:{state.next_book}"
        state.next_book += 1
        out[name] = encode(strings[state.book_written :])
        state.book_fields.append(name)
        state.book_written = len(strings)


def _write_rows(state: RequestLog, chunk: Chunk, rows: npt.NDArray[Any], out: Changes) -> None:
    through, delay = state.finalised_ms, state.delay_ms
    if through is not None:  # what a new owner would judge final by ``w:`` and ``d:``
        judged = delay if state.judged_delay_ms is None else state.judged_delay_ms
        behind = chunk.ts[rows] + judged <= through
        if behind.any():
            for r in chunk.requests(rows[behind], state.requests.book.strings):
                out["r:" + r.request_id] = encode(request_row(r)[1:])
                state.legacy.add(r.request_id)
            rows = rows[~behind]
    step = state.segment_rows
    for start in range(0, rows.size, step):
        part = chunk.take(rows[start : start + step])
        name = f"t:{state.next_segment}"
        state.next_segment += 1
        out[name] = encode_segment(part)
        heapq.heappush(state.segments, (int(part.ts.max()) + delay, name))
