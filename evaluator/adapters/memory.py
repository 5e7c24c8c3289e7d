"""The embedded state store: partition checkpoints and aggregates in process memory.

A real backend for the demo and for tests without services, held to the same
contract as the Redis store. Not durable: a restart starts from empty state.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from evaluator.core.experiments import SEP
from evaluator.core.finalise import Finalised
from evaluator.core.propensity.estimation import (
    DAY_MS,
    Observation,
    counter_day,
    first_kept_day,
    increments,
)
from evaluator.core.regression import HistoryKey
from evaluator.core.windows import AggregateLayout, expand_shards
from evaluator.engine.checkpoint import Checkpoint, Delta, Marks, Outcome, PartitionWrite
from evaluator.engine.commit_payload import (
    USERS,
    covariate_increments,
    experiment_increments,
    history_increments,
    merge_increments,
)
from evaluator.engine.ports import FloatArray


@dataclass(slots=True)
class _Partition:
    """A partition's checkpoint: owner epoch, changelog fields, offsets, event time."""

    epoch: int = 0
    seq: int = 0
    fields: dict[str, bytes] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    times: dict[str, int] = field(default_factory=dict)
    watermark_ms: int | None = None
    readout_ms: int | None = None
    own_ms: int | None = None
    forwarded_ms: int | None = None
    open_requests: int = 0


class MemoryStore:
    """In-process implementation of :class:`evaluator.engine.ports.StateStore`."""

    def __init__(self, layout: AggregateLayout, propensity_history_ms: int = 7 * DAY_MS) -> None:
        self.layout = layout
        self.propensity_history_ms = propensity_history_ms
        self._lock = threading.Lock()
        self._blocks: dict[tuple[int, int, str, int], FloatArray] = {}
        self._counters: Counter[str] = Counter()
        self._items: dict[tuple[int, int, str, int], set[str]] = {}
        self._propensity: dict[int, Counter[str]] = {}
        """Estimator counters per day of finalisation (see ``propensity.history``)."""
        self._curves: dict[int, tuple[float, ...]] = {}
        self._parts: dict[int, _Partition] = {}
        self._experiments: dict[tuple[str, int], FloatArray] = {}
        """(experiment US variant, shard) -> cumulative block."""
        self._exposures: Counter[str] = Counter()
        self._history: dict[tuple[int, str, int], FloatArray] = {}
        """(hour start, variant, partition) -> the regression detector's array."""

    def check_layout(self) -> None:
        return None

    def open_requests(self, watermark_ms: int) -> tuple[int, int]:
        return self.open_count(), 0

    def _add_propensity(self, observed: dict[int, list[Observation]], positions: int) -> None:
        for day, mine in observed.items():  # counters of exactly the requests claimed here
            counts = self._propensity.setdefault(day, Counter())
            counts.update(increments(mine, positions))

    def _aggregate(
        self,
        finalised: Finalised,
        i: int,
        shown: Sequence[str],
        *,
        shard: int,
        observed: dict[int, list[Observation]],
        written: dict[int, int],
    ) -> None:
        """Add request ``i``'s row to its window blocks (in ``shard``), its items (``shown``) to the
        coverage sets and its observation to ``observed`` (by day); ``written``: the
        oldest bucket start written per window."""
        layout = self.layout
        variant, user = finalised.due.variant[i], finalised.due.user_id[i]
        local = int(finalised.user_bucket[i]) // layout.shards
        cohort = int(finalised.cohort[i])
        for window in layout.windows_ms:
            start = int(layout.bucket_start(window, finalised.deadline_ms[i : i + 1])[0])
            written[window] = min(start, written.get(window, start))
            key = (window, start, variant, shard)
            block = self._blocks.get(key)
            if block is None:
                block = self._blocks[key] = np.zeros(layout.block_shape)
            block[cohort, local] += finalised.rows[i]
            for k in layout.ks:
                key = (window, start, variant, k)
                self._items.setdefault(key, set()).update(shown[:k])
            self._items.setdefault((window, start, variant, USERS), set()).add(user)
            if window == max(layout.windows_ms):
                key = (window, start, "*", 0)
                self._items.setdefault(key, set()).update(shown)
        if finalised.observations:
            day = counter_day(int(finalised.deadline_ms[i]))
            observed.setdefault(day, []).append(finalised.observations[i])

    def claim(self, partition: int) -> Checkpoint:
        with self._lock:
            part = self._parts.setdefault(partition, _Partition())
            part.epoch += 1
            return Checkpoint(
                part.epoch,
                part.seq,
                list(part.fields.items()),
                dict(part.offsets),
                dict(part.times),
                part.watermark_ms,
            )

    def checkpoint_many(self, writes: Sequence[PartitionWrite]) -> list[Outcome]:
        return [self.checkpoint(w.partition, w.epoch, w.seq, w.delta) for w in writes]

    def checkpoint(self, partition: int, epoch: int, seq: int, delta: Delta) -> Outcome:
        with self._lock:
            part = self._parts.setdefault(partition, _Partition())
            if part.epoch > epoch:
                return Outcome.FENCED
            if part.epoch < epoch or part.seq != seq:
                return Outcome.STALE
            part.seq += 1
            for key, value in delta.changes.items():
                if value is None:
                    part.fields.pop(key, None)
                else:
                    part.fields[key] = value
            part.offsets.update(delta.offsets)
            part.times.update(delta.times)
            if delta.watermark_ms is not None:
                part.watermark_ms = delta.watermark_ms
            if delta.readout_ms is not None:
                part.readout_ms = delta.readout_ms
            if delta.own_ms is not None:
                part.own_ms = delta.own_ms
            if delta.forwarded_ms is not None:
                part.forwarded_ms = delta.forwarded_ms
            part.open_requests = delta.open_requests
            self._counters.update({k: v for k, v in delta.counters.items() if v})
            self._exposures.update({k: v for k, v in delta.exposures.items() if v})
            observed: dict[int, list[Observation]] = {}
            written: dict[int, int] = {}
            for key, block in merge_increments(
                [experiment_increments(done, self.layout) for done in delta.finalised]
                + [covariate_increments(delta.covariates, self.layout)]
            ).items():
                found = self._experiments.get((key, partition))
                self._experiments[(key, partition)] = block if found is None else found + block
            for done in delta.finalised:
                shown = done.shown()
                for i in range(len(done)):
                    self._aggregate(
                        done, i, shown[i], shard=partition, observed=observed, written=written
                    )
                self._add_propensity(observed, done.propensity_positions)
                observed = {}
            self._add_history(partition, delta)
            self._prune(partition, written)
            return Outcome.WRITTEN

    def _add_history(self, partition: int, delta: Delta) -> None:
        """Add the regression history and drop this partition's arrays that fell
        ``history_keep_ms`` behind its newest written, as ``add_history`` (lua/lib.lua)."""
        added = merge_increments(
            [history_increments(d, self.layout) for d in delta.finalised] + [delta.provisional]
        )
        for (hour, variant), array in added.items():
            key = (hour, variant, partition)
            found = self._history.get(key)
            self._history[key] = array if found is None else found + array
        if added:
            first = max(hour for hour, _ in added) - self.layout.history_keep_ms
            self._history = {
                k: a for k, a in self._history.items() if k[2] != partition or k[0] >= first
            }

    def history(self, since_ms: int) -> dict[HistoryKey, FloatArray]:
        with self._lock:
            found = list(self._history.items())
        out: dict[HistoryKey, FloatArray] = {}
        for (hour, variant, _), array in found:
            if hour >= since_ms:
                key = (hour, variant)
                out[key] = out[key] + array if key in out else array.copy()
        return out

    def _prune(self, partition: int, written: dict[int, int]) -> None:
        """Drop what fell two window lengths behind the oldest bucket just written, as
        the Redis store does (``add_blocks`` in ``lua/lib.lua``): no reader asks for
        it, and the demo's memory stays bounded however long it runs."""
        cutoff = {window: start - 2 * window for window, start in written.items()}
        if not cutoff:
            return
        self._blocks = {
            key: block
            for key, block in self._blocks.items()
            if key[3] != partition or key[1] >= cutoff.get(key[0], key[1])
        }
        self._items = {
            key: items for key, items in self._items.items() if key[1] >= cutoff.get(key[0], key[1])
        }
        longest = max(self.layout.windows_ms)
        if longest in cutoff:
            self._curves = {b: c for b, c in self._curves.items() if b >= cutoff[longest]}

    def marks(self) -> dict[int, Marks]:
        with self._lock:
            parts = dict(self._parts)
        return {
            p: Marks(parts[p].own_ms, parts[p].forwarded_ms) if p in parts else Marks(None, None)
            for p in range(self.layout.shards)
        }

    def frontier(self) -> int | None:
        with self._lock:
            marks = [p.readout_ms for p in self._parts.values() if p.readout_ms is not None]
        return max(marks) if marks else None

    def open_count(self) -> int:
        with self._lock:
            return sum(p.open_requests for p in self._parts.values())

    def blocks(
        self, window_ms: int, since_ms: int | None = None, until_ms: int | None = None
    ) -> dict[tuple[int, str], FloatArray]:
        lo = -(2**63) if since_ms is None else since_ms
        hi = 2**63 if until_ms is None else until_ms
        grouped: dict[tuple[int, str], dict[int, FloatArray]] = {}
        with self._lock:
            for (window, start, variant, shard), block in self._blocks.items():
                if window == window_ms and lo <= start <= hi:
                    grouped.setdefault((start, variant), {})[shard] = block.copy()
        return {key: expand_shards(parts, self.layout) for key, parts in grouped.items()}

    def experiment_blocks(self, experiment: str) -> dict[str, FloatArray]:
        grouped: dict[str, dict[int, FloatArray]] = {}
        prefix = experiment + SEP
        with self._lock:
            for (key, shard), block in self._experiments.items():
                if key.startswith(prefix):
                    grouped.setdefault(key[len(prefix) :], {})[shard] = block.copy()
        return {v: expand_shards(parts, self.layout) for v, parts in grouped.items()}

    def exposures(self, experiment: str) -> dict[str, int]:
        prefix = experiment + SEP
        with self._lock:
            return {k[len(prefix) :]: n for k, n in self._exposures.items() if k.startswith(prefix)}

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        with self._lock:

            def union(name: str, k: int) -> int:
                sets = [self._items.get((window_ms, b, name, k), set()) for b in bucket_starts]
                return len(set().union(*sets))

            ks = (*self.layout.ks, USERS)
            counts = {(v, k): float(union(v, k)) for v in variants for k in ks}
            longest = max(self.layout.windows_ms)
            until = bucket_starts[-1] if bucket_starts else 0
            catalog: set[str] = set()
            for (window, start, name, _), items in self._items.items():
                if window == longest and name == "*" and until - longest <= start <= until:
                    catalog |= items
            return counts, float(len(catalog))

    def distinct_unions(
        self, window_ms: int, bucket_starts: Sequence[int], groups: Sequence[tuple[str, str, int]]
    ) -> list[float]:
        with self._lock:
            out = []
            for a, b, k in groups:
                sets = [
                    self._items.get((window_ms, s, v, k), set())
                    for s in bucket_starts
                    for v in (a, b)
                ]
                out.append(float(len(set().union(*sets))))
            return out

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def propensity_counts(self) -> dict[str, int]:
        with self._lock:
            if not self._propensity:
                return {}
            oldest = first_kept_day(max(self._propensity), self.propensity_history_ms)
            for day in [d for d in self._propensity if d < oldest]:
                del self._propensity[day]
            total: Counter[str] = Counter()
            for counts in self._propensity.values():
                total.update(counts)
            return dict(total)

    def propensity_curve(self, bucket_ms: int, proposal: tuple[float, ...]) -> tuple[float, ...]:
        with self._lock:
            return self._curves.setdefault(bucket_ms, proposal)

    def ping(self) -> bool:
        return True  # in this process: always there

    def close(self) -> None:
        return None
