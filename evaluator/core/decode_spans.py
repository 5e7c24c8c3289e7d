"""Decoding impressions with their items as hashed spans: the live engine's decoder.

The same contract as :func:`evaluator.core.decode.decode_impressions` (the same
events valid, the same reasons and details for the others), but no Python string per
item: each payload is decoded with its item list left as JSON text, the lists of the
whole batch are located and hashed at once (:mod:`evaluator.core.tokens`), and the
per-event checks read the item counts and repeats from there. Lists that are not
plain arrays of strings are decoded one by one, as before. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import msgspec
import numpy as np

from evaluator.core.decode import (
    _IMPRESSION_DECODER,
    _check_listed,
    _decode_error,
    _decode_valid,
    _impression_texts,
    _without_future,
    may_hold_reserved,
)
from evaluator.core.events import (
    Impression,
    ImpressionBatch,
    ImpressionHead,
    InvalidEvent,
    InvalidReason,
)
from evaluator.core.tokens import array_spans, repeated, with_strings

_HEAD_DECODER = cast("msgspec.json.Decoder[Impression]", msgspec.json.Decoder(ImpressionHead))
"""Decodes :class:`ImpressionHead` (typed as its base for the shared decoding loop)."""
_LIST_DECODER = msgspec.json.Decoder(list[str])


def decode_impression_spans(
    raw: Sequence[bytes],
    seed: int,
    max_list_length: int = 1000,
    base_index: int = 0,
    latest_ms: int | None = None,
) -> tuple[ImpressionBatch, list[InvalidEvent]]:
    """Decode and validate JSON impressions, their items as spans hashed with ``seed``
    (the batch's ``items``); invalid ones are returned, never raised."""
    reserved = may_hold_reserved(raw)
    decoded, invalid = _decode_valid(raw, _HEAD_DECODER, lambda head: None, base_index)
    heads = cast("list[ImpressionHead]", decoded)
    failed_at = {b.index - base_index for b in invalid}
    at = [i for i in range(len(raw)) if i not in failed_at]  # each head's input offset
    spans, plain = array_spans([h.items for h in heads])
    lists: dict[int, list[str]] = {}
    failed: dict[int, InvalidEvent] = {}
    for i in np.flatnonzero(~plain).tolist():  # escapes, or not a list of strings
        try:
            lists[i] = _LIST_DECODER.decode(heads[i].items)
        except msgspec.DecodeError:
            failed[i] = _full_error(raw[at[i]], base_index + at[i])
    spans = with_strings(spans, lists).hashed(seed)
    assert spans.key is not None
    repeats = repeated(spans, spans.key).tolist()
    counts = spans.counts().tolist()
    kept: list[int] = []
    for i, head in enumerate(heads):
        problem = failed.get(i)
        if problem is not None:
            invalid.append(problem)
            continue
        texts = _impression_texts(head, lists.get(i, ())) if reserved else None
        found = _check_listed(head, counts[i], repeats[i], max_list_length, texts)
        if found is None:
            kept.append(i)
        else:
            invalid.append(InvalidEvent(base_index + at[i], *found))
    invalid.sort(key=lambda b: b.index)
    events: list[Impression] = [heads[i] for i in kept]
    items = spans.take(np.asarray(kept, dtype=np.int64))
    valid, times, invalid = _without_future(events, invalid, latest_ms, base_index)
    batch = ImpressionBatch(events, [0] * len(events), items)
    if len(valid) < len(events):
        kept_ids = {id(e) for e in valid}
        batch = batch.take([j for j, e in enumerate(events) if id(e) in kept_ids])
    batch.timestamp_ms = times
    return batch, invalid


def _full_error(payload: bytes, index: int) -> InvalidEvent:
    """The error decoding the whole impression gives (its items did not decode)."""
    try:
        _IMPRESSION_DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        return _decode_error(index, exc)
    return InvalidEvent(index, InvalidReason.UNDECODABLE, "items is not a list of strings")
