"""A checkpoint's arguments as the checkpoint script reads them (``lua/checkpoint.lua``):
the changelog fields framed into three strings, the partition meta, counters, window
and experiment increments and propensity counts, in one msgpack payload."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from evaluator.adapters.redis.totals import Target
from evaluator.core.windows import AggregateLayout
from evaluator.engine.checkpoint import Delta
from evaluator.engine.commit_payload import (
    block_increments,
    covariate_increments,
    experiment_increments,
    history_increments,
    history_name,
    merge_increments,
    propensity_increments,
)


@dataclass(frozen=True, slots=True)
class CheckpointArgs:
    """The byte strings one checkpoint sends."""

    payload: bytes
    increments: bytes
    cumulative: bytes
    history: bytes
    """The regression history's increments (its names and hours are in the payload)."""
    lengths: bytes
    names: bytes
    values: bytes
    targets: tuple[Target, ...] = ()
    """The arrays that :attr:`increments`, :attr:`cumulative` and :attr:`history` add to,
    in that order (the store sends their totals: :mod:`evaluator.adapters.redis.totals`)."""


def _framed(changes: Mapping[str, bytes | None]) -> tuple[bytes, bytes, bytes]:
    """The written changelog fields as the checkpoint script reads them: per field the
    name's and the value's length in bytes (little-endian uint32 pairs), then all
    names and all values, each concatenated (three arguments instead of two per field,
    which the client would pack one by one; built without per-field packing)."""
    names = [k for k, v in changes.items() if v is not None]
    values = [v for v in changes.values() if v is not None]
    joined = "".join(names).encode()
    name_len = np.fromiter(map(len, names), dtype=np.uint32, count=len(names))
    if len(joined) != int(name_len.sum()):  # some name is not ASCII: count its bytes
        name_len = np.fromiter((len(n.encode()) for n in names), dtype=np.uint32)
    value_len = np.fromiter(map(len, values), dtype=np.uint32, count=len(values))
    lengths = np.column_stack((name_len, value_len)).astype("<u4").tobytes()
    return lengths, joined, b"".join(values)


def _meta(delta: Delta) -> list[Any]:
    """The partition meta fields (``pm``) written with the checkpoint."""
    meta: list[Any] = []
    for name, offset in delta.offsets.items():
        meta += [f"o:{name}", offset]
    for name, t in delta.times.items():
        meta += [f"t:{name}", t]
    if delta.watermark_ms is not None:
        meta += ["wm", delta.watermark_ms]
    if delta.readout_ms is not None:
        meta += ["rt", delta.readout_ms]
    if delta.own_ms is not None:
        meta += ["ow", delta.own_ms]
    if delta.forwarded_ms is not None:
        meta += ["fw", delta.forwarded_ms]
    meta += ["open", delta.open_requests]
    return meta


def checkpoint_args(delta: Delta, layout: AggregateLayout) -> CheckpointArgs:
    """Everything of ``delta`` that the script writes (see the module docstring)."""
    blocks: list[Any] = []
    increments: list[bytes] = []
    propensity: list[Any] = []
    variants: set[str] = set()
    for done in delta.finalised:
        rows = np.arange(len(done))
        found, incs = block_increments(done, rows, layout)
        blocks += found
        increments.append(incs)
        propensity += propensity_increments(done, rows)
        variants.update(done.due.variant)
    lengths, names, values = _framed(delta.changes)
    deleted = [k for k, v in delta.changes.items() if v is None]
    meta = _meta(delta)
    counters = [x for k, v in delta.counters.items() if v for x in (k, v)]
    cumulative = merge_increments(
        [experiment_increments(done, layout) for done in delta.finalised]
        + [covariate_increments(delta.covariates, layout)]
    )
    exposures = [x for k, v in delta.exposures.items() if v for x in (k, v)]
    history = merge_increments(
        [history_increments(done, layout) for done in delta.finalised] + [delta.provisional]
    )
    payload: tuple[Any, ...] = (
        [],
        deleted,
        meta,
        counters,
        blocks,
        propensity,
        sorted(variants),
        list(cumulative),
        exposures,
        [x for k, a in history.items() for x in (history_name(layout, k), k[0], a.size)],
    )
    nblock = int(np.prod(layout.block_shape))
    targets = [Target(f"b:{b[0]}", nblock, True) for b in blocks]
    targets += [Target(f"x:{key}", nblock, True) for key in cumulative]
    targets += [
        Target(f"rh:{history_name(layout, k)}", a.size, False, k[0]) for k, a in history.items()
    ]
    return CheckpointArgs(
        msgspec.msgpack.encode(payload),
        b"".join(increments),
        b"".join(b.astype("<f8").tobytes() for b in cumulative.values()),
        b"".join(b.astype("<f8").tobytes() for b in history.values()),
        lengths,
        names,
        values,
        tuple(targets),
    )
