"""The stored totals of the arrays a checkpoint adds to, held by the partition's owner,
so the checkpoint script writes each array whole instead of adding to it.

A checkpoint adds to a partition's window blocks (``b:``), experiment blocks (``x:``)
and regression history arrays (``rh:``): about 90,000 doubles a checkpoint at the
default windows and user buckets, whatever the traffic. Added in Lua (unpack, add,
pack), that took Redis ~24 ms a checkpoint on a 2-core VM (every checkpoint over
SLOWLOG's 10 ms, Redis blocked for all its clients meanwhile); a ``SET`` of the sum
copies bytes. Only the partition's owner writes these keys (its hash tag; newer
owners fence it by epoch), so the owner can hold what it wrote last and add to it:

- it holds the totals of the arrays its latest written checkpoint wrote, and reads
  (one ``GET`` exchange) those it does not hold: a new bucket, or a new owner;
- what a checkpoint computes is held only once the script reports it written; any
  other outcome, or an error (it may or may not have landed), drops the partition's
  totals, and so does a new owner epoch or a pause longer than :data:`HELD_S` (the
  keys' TTLs are longer);
- the sums are the same IEEE additions the script made, in the same order, so the
  stored values are bit for bit what adding in Redis gave. No I/O: the
  writer reads what is not held and passes it in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from evaluator.core.windows import AggregateLayout, stored_block

FloatArray = npt.NDArray[np.float64]

HELD_S = 60.0
"""Totals unused this long are read again (the shortest block TTL is over an hour)."""


class Target(NamedTuple):
    """One array a checkpoint adds to, in the order of its increments."""

    key: str
    """Its key after the partition's tag (``b:...``, ``x:...``, ``rh:...``)."""
    doubles: int
    blocked: bool
    """A window or experiment block (read widened when stored narrower); False: a
    regression history array (read as it is)."""
    start_ms: int = 0
    """A history array's hour (the script deletes those too far behind the newest)."""


@dataclass(slots=True)
class _Held:
    epoch: int
    at_s: float
    values: dict[str, FloatArray] = field(default_factory=dict)


class Totals:
    """Per owned partition, the stored totals of the arrays it wrote last."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._held: dict[int, _Held] = {}
        self._clock = clock

    def unknown(self, partition: int, epoch: int, targets: Iterable[Target]) -> list[str]:
        """The keys of ``targets`` whose totals must be read (distinct, in order)."""
        held = self._valid(partition, epoch)
        return list(dict.fromkeys(t.key for t in targets if t.key not in held))

    def sums(
        self,
        partition: int,
        epoch: int,
        targets: Sequence[Target],
        increments: bytes,
        *,
        read: Mapping[str, bytes | None],
        layout: AggregateLayout,
    ) -> tuple[bytes, dict[str, FloatArray]]:
        """The totals after adding ``increments`` (little-endian doubles, one target
        after another) as the script writes them, and the new totals by key (to
        :meth:`keep` once written). ``read``: stored values of the keys not held."""
        held = self._valid(partition, epoch)
        new: dict[str, FloatArray] = {}
        flat = np.frombuffer(increments, dtype="<f8")
        out = np.empty(flat.size, dtype="<f8")
        at = 0
        for t in targets:
            before = new.get(t.key)
            if before is None:
                before = held.get(t.key)
            if before is None:
                before = _stored(read.get(t.key), t, layout)
            total = before + flat[at : at + t.doubles]  # a new array: 0.0 + x == x
            new[t.key] = out[at : at + t.doubles] = total
            at += t.doubles
        return out.tobytes(), new

    def keep(
        self,
        partition: int,
        epoch: int,
        new: dict[str, FloatArray],
        targets: Sequence[Target],
        history_keep_ms: int,
    ) -> None:
        """A checkpoint was written: hold what it wrote, less the history arrays its
        script deleted as it wrote them (``history_keep_ms`` behind the newest hour it
        wrote). (The window blocks it deletes lie two window lengths behind the oldest
        it wrote: never one it wrote.)"""
        hours = [t.start_ms for t in targets if not t.blocked]
        first = max(hours) - history_keep_ms if hours else None
        kept = {
            t.key: new[t.key] for t in targets if t.blocked or first is None or t.start_ms >= first
        }
        self._held[partition] = _Held(epoch, self._clock(), kept)

    def forget(self, partition: int) -> None:
        """The partition's write did not land (or may not have): read its totals again."""
        self._held.pop(partition, None)

    def _valid(self, partition: int, epoch: int) -> dict[str, FloatArray]:
        held = self._held.get(partition)
        if held is None:
            return {}
        if held.epoch != epoch or self._clock() - held.at_s > HELD_S:
            del self._held[partition]
            return {}
        return held.values


def _stored(raw: bytes | None, target: Target, layout: AggregateLayout) -> FloatArray:
    """A stored array as the script would have read it: zeros when absent, a block
    written before columns were added widened."""
    if not raw:
        return np.zeros(target.doubles)
    if target.blocked:
        return stored_block(raw, layout).reshape(-1)
    value = np.frombuffer(raw, dtype="<f8")
    if value.size != target.doubles:
        raise ValueError(f"a stored history array {target.key} has {value.size} doubles")
    return value.astype(np.float64)


__all__ = ["HELD_S", "Target", "Totals"]
