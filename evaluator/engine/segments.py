"""Request segments: a chunk of open requests as one changelog value (``t:<n>``) and
back. Pure.

Each column is written as its bytes, with no per-row encoding: times as offsets
from the segment's first, fixed columns in their fewest bytes, ragged columns as
their row lengths and values, ids that are one prefix and a canonical lowercase
UUID as that prefix and 16 bytes each, and a column of codes with few distinct
values in the segment (an attribute's: a category, a brand) as those values and a
one- or two-byte index into them.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from evaluator.core.due import Ragged
from evaluator.engine import uuids
from evaluator.engine.chunks import LABELS, Chunk, Index, dictionary, fewest, hashes_of
from evaluator.engine.codebook import NONE
from evaluator.engine.uuids import IdColumn, UuidIds

SEGMENT_FORMAT = 4
"""The version of :func:`encode_segment`'s layout (its first element): 4 may have a
fifth label column (the interleaving draft, when a row has one); 3 (read) may store a
column of codes through the segment's own dictionary (:data:`DICTIONARY`); 2 (read)
stores the impression times as offsets from the first, every fixed column in its
fewest bytes and UUID ids as 16 bytes; 1 (read) stored them as held in memory."""

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def _packed(values: npt.NDArray[Any]) -> tuple[str, bytes]:
    return values.dtype.str, values.tobytes()


def _unpacked(dtype: str, raw: bytes) -> npt.NDArray[Any]:
    return np.frombuffer(raw, dtype=np.dtype(dtype))


def _lengths(part: Ragged) -> tuple[str, bytes, str, bytes]:
    """A ragged column as its row lengths (in the fewest bytes) and its values."""
    lengths = np.diff(part.off)
    longest = int(lengths.max(initial=0))
    narrow = np.uint8 if longest < 2**8 else np.uint16 if longest < 2**16 else np.int32
    return (*_packed(lengths.astype(narrow)), *_packed(part.flat))


UUIDS = "uuid"
"""A column of ids that are all one prefix and a canonical lowercase UUID, stored as
the prefix and 16 bytes each."""


def _ids(part: IdColumn) -> tuple[Any, ...]:
    """An id column: :data:`UUIDS`, the ids' common prefix and the 16 bytes of each
    when every id is that prefix and a canonical lowercase UUID (what most producers
    send: 16 bytes instead of 36), else as :func:`_lengths`."""
    packed = part if isinstance(part, UuidIds) else uuids.compact(part)
    if isinstance(packed, UuidIds) and packed.rows_count:
        return UUIDS, packed.prefix, packed.raw.tobytes()
    return _lengths(packed.ragged() if isinstance(packed, UuidIds) else packed)  # as before


DICTIONARY = "dict"
"""A column of codes stored as its row lengths, its distinct codes and, for each value,
its index among them (one byte for at most 256 distinct codes, two for 65,536)."""


def _codes(part: Ragged, distinct: npt.NDArray[Any] | None = None) -> tuple[Any, ...]:
    """A column of codes: :data:`DICTIONARY` when its index is narrower than the
    codes (:func:`~evaluator.engine.chunks.dictionary`), else as :func:`_lengths`.
    With ``distinct``, ``part`` is an index into those codes already (a chunk's
    attributes)."""
    index = part
    if distinct is None:
        index, distinct = dictionary(part)
        if distinct is None:
            return _lengths(part)
    lengths_dtype, lengths, index_dtype, flat = _lengths(index)
    return (DICTIONARY, lengths_dtype, lengths, *_packed(distinct), index_dtype, flat)


def _ragged(*part: Any) -> Ragged:
    """A column as :func:`_lengths` or :func:`_codes` wrote it."""
    if part[0] == DICTIONARY:
        _, lengths_dtype, lengths, dtype, distinct, index_dtype, index = part
        flat = _unpacked(dtype, distinct)[_unpacked(index_dtype, index)]
        return Ragged.of(flat, _unpacked(lengths_dtype, lengths).astype(np.int64))
    lengths_dtype, lengths, dtype, flat = part
    return Ragged.of(_unpacked(dtype, flat), _unpacked(lengths_dtype, lengths).astype(np.int64))


def encode_segment(chunk: Chunk) -> bytes:
    """A chunk's rows as one changelog value: each column's bytes (codes of the
    codebook written with it), no per-row encoding; times as offsets from the
    earliest, fixed columns in their fewest bytes, UUID ids as 16 bytes."""
    base = int(chunk.ts.min(initial=0))
    return _encode(
        [
            SEGMENT_FORMAT,
            [
                base,
                *_packed(fewest(chunk.ts - base)),
                *_packed(fewest(_written_labels(chunk.labels))),
                *_packed(fewest(chunk.randomized)),
            ],
            [
                _ids(chunk.ids),
                _ids(chunk.users),
                _codes(chunk.items),
                _codes(chunk.attributes, chunk.attribute_values),
                _codes(chunk.shadow),
            ],
        ]
    )


def _written_labels(labels: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The label columns a segment stores: the draft's only when a row is interleaved
    (most segments have none, and read back with the column all -1)."""
    if labels.shape[1] < LABELS or bool((labels[:, LABELS - 1] != NONE).any()):
        return labels
    return labels[:, : LABELS - 1]


def decode_segment(raw: bytes) -> Chunk:
    """The chunk :func:`encode_segment` wrote (its rows all live, indexes rebuilt)."""
    version, fixed, ragged = _decode(raw)
    if version not in (1, 2, 3, SEGMENT_FORMAT):
        raise ValueError(f"request segment of format {version}, not {SEGMENT_FORMAT}")
    base = fixed.pop(0) if version >= 2 else 0
    ts, labels, randomized = (_unpacked(fixed[k], fixed[k + 1]) for k in range(0, len(fixed), 2))
    ts = ts.astype(np.int64) + base
    labels, randomized = fewest(labels), fewest(randomized)
    ids, users = (_id_column(*ragged[k]) for k in (0, 1))
    items, shadow = (_ragged(*ragged[k]) for k in (2, 4))
    attributes, values = _attributes(ragged[3])
    n = int(ts.size)
    labels = labels.reshape(n, labels.size // n if n else LABELS)
    if labels.shape[1] < LABELS:  # written before the draft: none is interleaved
        labels = np.pad(labels, ((0, 0), (0, LABELS - labels.shape[1])), constant_values=NONE)
    return Chunk(
        ts.astype(np.int64),
        labels,
        randomized,
        np.ones(n, dtype=np.bool_),
        ids,
        users,
        items,
        attributes,
        shadow,
        Index.of(hashes_of(ids.texts(np.arange(n)), n)),
        Index.of(hashes_of(users.texts(np.arange(n)), n)),
        n,
        values,
    )


def _id_column(*part: Any) -> IdColumn:
    """An id column as :func:`_ids` wrote it (UUIDs held as they are stored)."""
    if part[0] == UUIDS:
        _, prefix, packed = part
        raw = np.frombuffer(packed, dtype=np.uint8).reshape(len(packed) // 16, 16)
        return UuidIds(prefix, raw)
    return uuids.compact(_ragged(*part))


def _attributes(part: list[Any]) -> tuple[Ragged, npt.NDArray[Any] | None]:
    """The attribute column as a chunk holds it: written through a dictionary, that
    dictionary and the index as they are; else its codes (the chunk makes its own)."""
    if part[0] != DICTIONARY:
        return _ragged(*part), None
    _, lengths_dtype, lengths, dtype, distinct, index_dtype, index = part
    lengths_of = _unpacked(lengths_dtype, lengths).astype(np.int64)
    return Ragged.of(_unpacked(index_dtype, index), lengths_of), _unpacked(dtype, distinct)
