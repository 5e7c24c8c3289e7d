"""Rebuilding a partition's join state from its changelog fields: what a new owner
loads. Pure (the store reads the fields).

Segments hold rows that may be dead by now: a request segment's row is final once
the finalisation watermark (``w:``) has passed its deadline, an interaction
segment's row is consumed once its request is not open any more, and a marker
segment's entry has expired once its deadline is before the expiry bound
(``m:``). :mod:`evaluator.engine.state` lists the fields.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

import numpy as np

from evaluator.core.due import PendingInteraction
from evaluator.engine.chunks import Chunk
from evaluator.engine.codebook import Codebook
from evaluator.engine.columns import OpenTable
from evaluator.engine.records import decode
from evaluator.engine.segments import decode_segment
from evaluator.engine.state import PartitionState

_decode = decode


def restore_state(
    fields: Iterable[tuple[str, bytes]], deadline: Any, history_cap: int
) -> PartitionState:
    """Rebuild the state from its changelog fields (``deadline``: impression time ->
    finalisation deadline)."""
    state = PartitionState(history_cap=history_cap, delay_ms=deadline(0))
    rows: list[list[Any]] = []
    markers: list[tuple[str, list[list[Any]]]] = []
    fielded: list[tuple[str, list[Any]]] = []
    waiting: list[tuple[str, list[list[Any]]]] = []
    book: list[tuple[int, str, list[str]]] = []
    tables: list[tuple[str, bytes]] = []
    seen: list[tuple[str, int]] = []
    for name, raw in fields:
        kind, key = name[0], name[2:]
        if kind in "tc":
            _collect_columns(state, name, raw, book=book, tables=tables)
        elif kind in "srwdgmk":
            _load_segmented(
                state, kind, name, _decode(raw), deadline=deadline, rows=rows, markers=markers
            )
        elif kind == "i":
            rid, item, ts, grade = _decode(raw)
            if key not in state.named_rid:
                state.attach(rid, PendingInteraction(key, item, ts, grade))
            state.fielded.add(key)
        elif kind == "j":
            waiting.append((name, _decode(raw)))
            state.next_interaction_segment = max(state.next_interaction_segment, int(key) + 1)
        elif kind == "l":
            uid, item, ts, grade = _decode(raw)
            state.user(uid).loose[key] = PendingInteraction(key, item, ts, grade)
            state.loose_user[key] = uid
            state.loose_expiry.append((ts, uid, key))
        elif kind in "hau":
            _load_user(state, kind, key, _decode(raw))
        elif kind == "p":
            state.pending = [(t, k, u) for t, k, u in _decode(raw)]
        elif kind == "q":
            state.scored_ms = _decode(raw)
        elif kind == "f":
            fielded.append((key, _decode(raw)))
        elif kind in "ve":
            _load_exposures(state, name, raw)
        elif kind == "x":  # versions before 2026-12-07: hashed by the markers
            seen.append((key, _decode(raw)))
    state.markers.load(markers, fielded, seen)
    state.exposed.loaded()
    _load_book(state, book)
    _reopen_tables(state, tables, deadline)
    _reopen(state, rows)
    _rewait(state, waiting, deadline)
    rids = list(state.named)
    state.expiry += [  # as :meth:`PartitionState.add_named` keeps them
        (it.timestamp_ms, it.event_id)
        for rid, is_open in zip(rids, state.requests.contains(rids), strict=True)
        if not is_open
        for it in state.named[rid]
    ]
    heapq.heapify(state.segments)
    heapq.heapify(state.expiry)
    heapq.heapify(state.loose_expiry)
    return state


def _load_user(state: PartitionState, kind: str, user_id: str, value: Any) -> None:
    """One user's cold-start history (``h:``), latest active day (``a:``) or activity
    by day (``u:``)."""
    user = state.user(user_id)
    if kind == "h":
        user.history = [(t, e) for t, e in value]
    elif kind == "a":
        user.active_ms = value
    else:
        user.days = list(value)


def _load_exposures(state: PartitionState, name: str, raw: bytes) -> None:
    """An experiment's exposed users (``v:``), or one user's exposure (``e:``, written
    by versions before exposure sets: hashed once the seed is known)."""
    if name[0] == "v":
        state.exposed.load(name, _decode(raw))
    else:
        experiment, user = name[2:].split("\x1f", 1)
        state.exposed.legacy.append((experiment, user))


def _load_segmented(
    state: PartitionState,
    kind: str,
    name: str,
    value: Any,
    *,
    deadline: Any,
    rows: list[list[Any]],
    markers: list[tuple[str, list[list[Any]]]],
) -> None:
    """A field of the segmented part of the changelog: request segments (and single
    ``r:`` requests) and marker segments are collected for after the loop; the
    watermarks that decide which of their rows still count are kept."""
    key = name[2:]
    if kind == "s":
        rows += value
        state.segments.append((max(deadline(row[3]) for row in value), name))
        state.next_segment = max(state.next_segment, int(key) + 1)
    elif kind == "r":
        rows.append([key, *value])
        state.legacy.add(key)
    elif kind == "g":
        markers.append((name, value))
    elif kind == "w":
        state.finalised_ms = value
    elif kind == "d":
        state.judged_delay_ms = value
    elif kind == "k":  # the markers' hash seed
        state.markers.seed, state.markers.seed_written = value, True
    else:  # "m"
        state.markers.before_ms = value


def _rewait(
    state: PartitionState, segments: list[tuple[str, list[list[Any]]]], deadline: Any
) -> None:
    """The waiting interactions among interaction segments' rows: those whose request
    is open (its finalisation consumes the others). Each segment goes once every
    request it names is final (if none is open, at the next finalisation that moves
    the watermark)."""
    gone = state.finalised_ms if state.finalised_ms is not None else -(2**62)
    for name, rows in segments:
        last = gone
        times = state.requests.times([row[1] for row in rows])
        for (eid, rid, item, ts, grade), shown_ms in zip(rows, times, strict=True):
            if shown_ms is None:
                continue
            if eid not in state.named_rid:
                state.attach(rid, PendingInteraction(eid, item, ts, grade))
            last = max(last, deadline(shown_ms))
        state.segments.append((last, name))


def _collect_columns(
    state: PartitionState,
    name: str,
    raw: bytes,
    *,
    book: list[tuple[int, str, list[str]]],
    tables: list[tuple[str, bytes]],
) -> None:
    """A column segment (``t:``, decoded once the codebook is whole) or a part of the
    codebook (``c:``)."""
    key = int(name[2:])
    if name[0] == "t":
        tables.append((name, raw))
        state.next_segment = max(state.next_segment, key + 1)
    else:
        book.append((key, name, _decode(raw)))


def _load_book(state: PartitionState, parts: list[tuple[int, str, list[str]]]) -> None:
    """The codebook, from its ``c:`` fields in order."""
    parts.sort()
    book = Codebook(chain.from_iterable(strings for _, _, strings in parts))
    state.requests = OpenTable(book)
    state.book_written = len(book)
    state.book_fields = [name for _, name, _ in parts]
    state.next_book = parts[-1][0] + 1 if parts else 0


def _reopen_tables(state: PartitionState, tables: list[tuple[str, bytes]], deadline: Any) -> None:
    """The open requests of column segments (``t:``), judged as :func:`_reopen` judges
    a segment's rows."""
    through = state.finalised_ms
    judged = state.delay_ms if state.judged_delay_ms is None else state.judged_delay_ms

    def opened() -> Iterator[Chunk]:  # decoded as they are added: one group held at once
        for name, raw in tables:
            chunk = decode_segment(raw)
            state.segments.append((deadline(int(chunk.ts.max())), name))
            ids = chunk.ids.texts(np.arange(chunk.size))
            live = ~np.array(state.markers.finalised(ids), bool)
            if through is not None:
                live &= chunk.ts + judged > through
            chunk.alive &= live
            chunk.live = int(chunk.alive.sum())
            yield chunk

    state.requests.add_many(opened())


def _reopen(state: PartitionState, rows: list[list[Any]]) -> None:
    """The open requests among stored rows: a segment's row is final once the
    finalisation has passed its deadline under the settings it ran with (``d:``), an
    ``r:`` field's once it is marked final. Open ones get their deadline under the
    current settings."""
    through = state.finalised_ms
    judged = state.delay_ms if state.judged_delay_ms is None else state.judged_delay_ms
    reopened: dict[str, list[Any]] = {}
    rids = [row[0] for row in rows]
    final = {rid for rid, done in zip(rids, state.markers.finalised(rids), strict=True) if done}
    for row in rows:
        rid, ts = row[0], row[3]
        if rid in state.legacy:
            if rid in final:  # its field should have gone with it
                state.legacy.discard(rid)
                state.changes["r:" + rid] = None
                continue
        elif (through is not None and ts + judged <= through) or rid in final:
            continue
        reopened[rid] = row
    state.requests.append(list(reopened.values()))
