"""The embedded state store: the whole pipeline state in process memory.

A real backend for the demo and for tests without services, held to the same
contract as the Redis store. Not durable: a restart starts from empty state.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from evaluator.engine.checkpoint import Checkpoint, Delta, Outcome
from evaluator.events import Impression, ImpressionBatch, Interaction, InteractionBatch
from evaluator.finalise import Finalised, OpenRequest, PendingInteraction, UserContext
from evaluator.propensity_estimation import (
    DAY_MS,
    Observation,
    counter_day,
    first_kept_day,
    increments,
)
from evaluator.stores.base import DueRequest, FloatArray, IngestCounts, PartitionProgress
from evaluator.windows import AggregateLayout, expand_shards, shard_of


@dataclass(slots=True)
class _User:
    open_requests: dict[str, int] = field(default_factory=dict)
    loose: dict[tuple[str, str, float], PendingInteraction] = field(default_factory=dict)
    history: dict[str, int] = field(default_factory=dict)
    late: set[str] = field(default_factory=set)


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
    open_requests: int = 0


class MemoryStore:
    """In-process implementation of :class:`evaluator.stores.base.StateStore`."""

    def __init__(
        self,
        layout: AggregateLayout,
        history_cap: int = 3,
        attribute: str = "category",
        propensity_history_ms: int = 7 * DAY_MS,
    ) -> None:
        self.layout = layout
        self.attribute = attribute
        self.history_cap = history_cap
        self.propensity_history_ms = propensity_history_ms
        self._lock = threading.Lock()
        self._requests: dict[str, OpenRequest] = {}
        self._deadline: dict[str, tuple[int, int]] = {}
        self._pending: dict[str, dict[str, PendingInteraction]] = {}
        self._final: dict[str, set[str]] = {}
        self._users: dict[str, _User] = {}
        self._blocks: dict[tuple[int, int, str, int], FloatArray] = {}
        self._progress: dict[str, PartitionProgress] = {}
        self._counters: Counter[str] = Counter()
        self._items: dict[tuple[int, int, str, int], set[str]] = {}
        self._propensity: dict[int, Counter[str]] = {}
        """Estimator counters per day of finalisation (see ``propensity.history``)."""
        self._curves: dict[int, tuple[float, ...]] = {}
        self._parts: dict[int, _Partition] = {}

    def check_layout(self) -> None:
        return None

    def _user(self, user_id: str) -> _User:
        user = self._users.get(user_id)
        if user is None:
            user = self._users[user_id] = _User()
        return user

    def ingest(
        self,
        impressions: ImpressionBatch,
        interactions: InteractionBatch,
        deadlines_ms: Sequence[int],
        loose_late_before_ms: int,
    ) -> IngestCounts:
        counts = IngestCounts()
        shards = shard_of([e.user_id for e in impressions.events], self.layout).tolist()
        with self._lock:
            for event, ts, deadline, shard in zip(
                impressions.events, impressions.timestamp_ms, deadlines_ms, shards, strict=True
            ):
                rid = event.request_id
                if rid in self._requests or rid in self._final:
                    counts.duplicates += 1
                    continue
                self._requests[rid] = OpenRequest(
                    rid,
                    event.user_id,
                    event.variant,
                    ts,
                    list(event.items),
                    attributes=list((event.item_attributes or {}).get(self.attribute, [])),
                    shadow_variant=_shadow(event)[0],
                    shadow=_shadow(event)[1],
                    context=event.context or "",
                    randomization=event.randomization.key() if event.randomization else None,
                )
                self._deadline[rid] = (deadline, shard)
                self._user(event.user_id).open_requests[rid] = ts
            for it, ts, grade in zip(
                interactions.events, interactions.timestamp_ms, interactions.grade, strict=True
            ):
                self._ingest_interaction(it, ts, grade, loose_late_before_ms, counts)
            self._counters["duplicates"] += counts.duplicates
            self._counters["late"] += counts.late
        return counts

    def prepare_ingest(
        self,
        impressions: ImpressionBatch,
        interactions: InteractionBatch,
        deadlines_ms: Sequence[int],
    ) -> object:
        return (impressions, interactions, deadlines_ms)

    def apply_ingest(self, prepared: object, loose_late_before_ms: int) -> IngestCounts:
        impressions, interactions, deadlines = cast(
            "tuple[ImpressionBatch, InteractionBatch, Sequence[int]]", prepared
        )
        return self.ingest(impressions, interactions, deadlines, loose_late_before_ms)

    def _ingest_interaction(
        self,
        it: Interaction,
        ts: int,
        grade: float,
        loose_late_before_ms: int,
        counts: IngestCounts,
    ) -> None:
        event_id, user_id, item_id, request_id = it.event_id, it.user_id, it.item_id, it.request_id
        user = self._user(user_id)
        if grade > 0 and event_id not in user.history:
            user.history[event_id] = ts
            if len(user.history) > self.history_cap:
                latest = max(user.history, key=lambda k: (user.history[k], k))
                del user.history[latest]
        pending = PendingInteraction(event_id, item_id, ts, grade)
        if request_id:
            late_ids = self._final.get(request_id)
            if late_ids is not None:
                if event_id in late_ids:
                    counts.duplicates += 1
                else:
                    late_ids.add(event_id)
                    counts.late += 1
                return
            bucket = self._pending.setdefault(request_id, {})
            if event_id in bucket:
                counts.duplicates += 1
            else:
                bucket[event_id] = pending
            return
        if ts < loose_late_before_ms:
            if event_id in user.late:
                counts.duplicates += 1
            else:
                user.late.add(event_id)
                counts.late += 1
            return
        key = (event_id, item_id, grade)
        if key in user.loose:
            counts.duplicates += 1
        else:
            user.loose[key] = pending

    def due(self, watermark_ms: int, limit: int) -> list[DueRequest]:
        with self._lock:
            ready = sorted(
                (d, shard, rid) for rid, (d, shard) in self._deadline.items() if d <= watermark_ms
            )
        return [DueRequest(shard, rid) for _, shard, rid in ready[:limit]]

    def open_requests(self, watermark_ms: int) -> tuple[int, int]:
        """Open requests as of each partition's last checkpoint, and how many are due:
        none, since a partition finalises what its event time makes due in the same
        checkpoint."""
        return self.open_count(), 0

    def load(self, due: Sequence[DueRequest]) -> tuple[list[OpenRequest], dict[str, UserContext]]:
        requests: list[OpenRequest] = []
        users: dict[str, UserContext] = {}
        with self._lock:
            for _, rid in due:
                open_request = self._requests.get(rid)
                if open_request is None:
                    continue
                interactions = list(self._pending.get(rid, {}).values())
                requests.append(dataclasses.replace(open_request, interactions=interactions))
                if open_request.user_id not in users:
                    users[open_request.user_id] = self._context(open_request.user_id)
        return requests, users

    def _context(self, user_id: str) -> UserContext:
        user = self._user(user_id)
        ordered = sorted((ts, rid) for rid, ts in user.open_requests.items())
        return UserContext(
            impression_ms=[ts for ts, _ in ordered],
            impression_ids=[rid for _, rid in ordered],
            impression_items=[self._requests[rid].items for _, rid in ordered],
            loose=sorted(user.loose.values()),
            history_ms=sorted(user.history.values()),
        )

    def commit(self, finalised: Finalised, prune_loose_before_ms: int | None = None) -> int:
        applied = late = 0
        observed: dict[int, list[Observation]] = {}
        with self._lock:
            for i, request in enumerate(finalised.requests):
                rid = request.request_id
                if rid in self._final or rid not in self._requests:
                    continue
                # applied interaction ids stay known: a redelivery is a duplicate, not late;
                # ones stored after the request was loaded were not applied: they are late
                pending = self._pending.pop(rid, {})
                late += max(0, len(pending) - len(request.interactions))
                self._final[rid] = set(pending)
                _, shard = self._deadline.pop(rid)
                del self._requests[rid]
                user = self._user(request.user_id)
                user.open_requests.pop(rid, None)
                if prune_loose_before_ms is not None:
                    user.late.update(
                        v.event_id
                        for v in user.loose.values()
                        if v.timestamp_ms < prune_loose_before_ms
                    )
                    user.loose = {
                        k: v
                        for k, v in user.loose.items()
                        if v.timestamp_ms >= prune_loose_before_ms
                    }
                self._aggregate(finalised, i, shard, observed)
                applied += 1
            self._counters["finalised"] += applied
            if late:
                self._counters["late"] += late
                finalised.late += late
            self._add_propensity(observed, finalised.propensity_positions)
        return applied

    def _add_propensity(self, observed: dict[int, list[Observation]], positions: int) -> None:
        for day, mine in observed.items():  # counters of exactly the requests claimed here
            counts = self._propensity.setdefault(day, Counter())
            counts.update(increments(mine, positions))

    def _aggregate(
        self, finalised: Finalised, i: int, shard: int, observed: dict[int, list[Observation]]
    ) -> None:
        """Add request ``i``'s row to its window blocks (in ``shard``), its items to the
        coverage sets and its observation to ``observed`` (by day)."""
        layout = self.layout
        request = finalised.requests[i]
        local = int(finalised.user_bucket[i]) // layout.shards
        cohort = int(finalised.cohort[i])
        for window in layout.windows_ms:
            start = int(layout.bucket_start(window, finalised.deadline_ms[i : i + 1])[0])
            key = (window, start, request.variant, shard)
            block = self._blocks.get(key)
            if block is None:
                block = self._blocks[key] = np.zeros(layout.block_shape)
            block[cohort, local] += finalised.rows[i]
            for k in layout.ks:
                key = (window, start, request.variant, k)
                self._items.setdefault(key, set()).update(request.items[:k])
            if window == max(layout.windows_ms):
                key = (window, start, "*", 0)
                self._items.setdefault(key, set()).update(request.items)
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
            part.open_requests = delta.open_requests
            self._counters.update({k: v for k, v in delta.counters.items() if v})
            observed: dict[int, list[Observation]] = {}
            for done in delta.finalised:
                for i in range(len(done.requests)):
                    self._aggregate(done, i, partition, observed)
                self._add_propensity(observed, done.propensity_positions)
                observed = {}
            return Outcome.WRITTEN

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

    def distinct_items(
        self, window_ms: int, bucket_starts: Sequence[int], variants: Sequence[str]
    ) -> tuple[dict[tuple[str, int], float], float]:
        with self._lock:

            def union(name: str, k: int) -> int:
                sets = [self._items.get((window_ms, b, name, k), set()) for b in bucket_starts]
                return len(set().union(*sets))

            counts = {(v, k): float(union(v, k)) for v in variants for k in self.layout.ks}
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

    def record_progress(self, progress: Mapping[str, PartitionProgress]) -> None:
        with self._lock:
            for key, value in progress.items():
                old = self._progress.get(key)
                if old is None or value.max_event_ms >= old.max_event_ms:
                    self._progress[key] = value
                else:
                    self._progress[key] = PartitionProgress(old.max_event_ms, value.updated_ms)

    def progress(self) -> dict[str, PartitionProgress]:
        with self._lock:
            return dict(self._progress)

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

    def close(self) -> None:
        return None


def _shadow(event: Impression) -> tuple[str, list[str]]:
    """The shadow ranking kept with a request: the first by variant name, if any."""
    if not event.shadow:
        return "", []
    variant = min(event.shadow)
    return variant, list(event.shadow[variant])
