"""The partition engine: join, event time and finalisation of one partition, in memory.

A user's impressions and interactions all live in one partition (both topics
are keyed by user id and co-partitioned), so one engine per partition sees
everything its requests can join, and the partition's own event time alone
decides when a request is final. ``evaluator run`` keeps one engine per owned
partition and checkpoints its changelog, offsets and aggregate increments
atomically; the demo feeds the same engine from the simulator. ``evaluator
replay`` runs the same join, grading, scoring and aggregation functions over a
whole file at once (not yet this engine: it would be several times slower).
Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluator.core.ab.cuped import DAY_MS
from evaluator.core.due import Due, PendingInteraction
from evaluator.core.events import ImpressionBatch, InteractionBatch
from evaluator.core.experiments import Experiment, experiment_rows
from evaluator.core.finalise import (
    FinaliseConfig,
    Finalised,
    finalise,
)
from evaluator.core.regression import HistoryKey
from evaluator.engine import activity
from evaluator.engine.clocks import InputClock, Settled, progress
from evaluator.engine.commit_payload import FloatArray, merge_increments
from evaluator.engine.contexts import due_contexts, named_columns
from evaluator.engine.early import provisional_pass
from evaluator.engine.markers import Markers
from evaluator.engine.plan import EngineConfig
from evaluator.engine.records import impression_row
from evaluator.engine.state import Changes, PartitionState

HOLD_MS = -(2**61)
"""A limit at or below this holds the watermark where it is (None stays None)."""

Configure = Callable[[Due], list[tuple[FinaliseConfig, Due]]]
"""Groups due requests by the finalisation config they use (one curve per bucket)."""


@dataclass(slots=True)
class StepCounts:
    """What one step did, for the exactly-once counters kept with the state."""

    duplicates: int = 0
    late: int = 0
    finalised: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    exposures: Counter[str] = field(default_factory=Counter)
    """Users first exposed, per ``experiment US variant``."""
    covariates: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    """Of those, (user, CUPED covariate) for the users who have one."""
    provisional: dict[HistoryKey, FloatArray] = field(default_factory=dict)
    """What open requests scored at their provisional age add to the history."""


class _Late:
    """The interactions of a batch that name a finalised request: each is late the
    first time (its event id's hash is recorded with the request's deadline), a
    duplicate after (the ingestion finds its id seen). Here, one that an older
    version marked as a (request, event, deadline) hash is found a duplicate too."""

    def __init__(self, markers: Markers, events: list[Any], marked: dict[str, int | None]):
        self.markers = markers
        self.keys: dict[int, int] = {}
        self.deadline: dict[int, int] = {}
        self.known: set[int] = set()
        self.new: list[int] = []
        if all(d is None for d in marked.values()):  # most batches: no hashing
            return
        at = [
            n for n, it in enumerate(events) if it.request_id and marked[it.request_id] is not None
        ]
        deadlines = [marked[events[n].request_id] or 0 for n in at]  # none is None
        rids = [events[n].request_id for n in at]
        keys = markers.pair_keys(rids, [events[n].event_id for n in at], deadlines)
        self.keys = dict(zip(at, keys.tolist(), strict=True))
        self.deadline = dict(zip(at, deadlines, strict=True))
        applied = markers.were_applied(keys)
        self.known = {k for k, a in zip(keys.tolist(), applied, strict=True) if a}

    def count(self, n: int) -> bool:
        """Whether event ``n`` is late (not applied or counted before)."""
        key = self.keys[n]
        if key in self.known:
            return False
        self.known.add(key)
        self.new.append(n)
        return True

    def record(self, events: list[Any]) -> None:
        if self.new:
            keys = self.markers.seen_keys([events[n].event_id for n in self.new])
            deadlines = np.array([self.deadline[n] for n in self.new], dtype=np.int64)
            self.markers.add_applied(keys, deadlines)


class PartitionEngine:
    """Join state and event time of one partition; see the module docstring."""

    def __init__(
        self,
        partition: int,
        config: EngineConfig,
        state: PartitionState | None = None,
        watermark_ms: int | None = None,
        inputs: Mapping[str, int] | None = None,
    ) -> None:
        self.partition = partition
        self.config = config
        self.state = state or PartitionState(history_cap=config.history_cap)
        self.state.lookback_days = config.cuped_lookback_days
        self.watermark_ms = watermark_ms
        """Never moves back; None until every input has delivered (or gone idle)."""
        self.own_ms: int | None = watermark_ms
        """The watermark of this partition's own inputs, before any limit: what other
        partitions wait for while they receive events forwarded from here."""
        known = inputs or {}
        self.inputs: dict[str, InputClock] = {
            name: InputClock(max_event_ms=known.get(name)) for name in config.inputs
        }
        self.settled = Settled(config.inputs[0])
        """The event time every input has delivered up to: expiry follows it."""
        self.counts = StepCounts()
        self._history_swept_ms: int | None = None
        self._ended: set[str] = set()

    # --- ingestion --------------------------------------------------------------

    def ingest(self, impressions: ImpressionBatch, interactions: InteractionBatch) -> None:
        """Store new events; repeats are duplicates, events for final requests are late."""
        if impressions.events:  # a poll's batch is of one kind: the other is empty
            self._ingest_impressions(impressions)
        if interactions.events:
            self._ingest_interactions(interactions)

    def _ingest_impressions(self, impressions: ImpressionBatch) -> None:
        state, counts = self.state, self.counts
        delay = self.config.finalise.deadline(0)  # a constant delay after each impression
        attribute, shadow_of = self.config.attribute, self.config.shadow_of
        # experiments whose records were dropped (ended a horizon ago, by the data's own
        # time, which survives reloads) count nobody again
        data_ms = self.settled_ms()
        experiments = [e for e in self.config.experiments if not self._over(e, data_ms)]
        events = impressions.events
        rids = [e.request_id for e in events]
        already = state.requests.contains(rids)
        final = state.markers.finalised(rids)
        fresh: dict[str, tuple[Any, ...]] = {}
        kept: list[int] = []
        for n, (event, ts, known, done) in enumerate(
            zip(events, impressions.timestamp_ms, already, final, strict=True)
        ):
            rid = event.request_id
            if known or done or rid in fresh:
                counts.duplicates += 1
                continue
            fresh[rid] = impression_row(event, ts, attribute, shadow_of)
            kept.append(n)
        if experiments and kept:
            new = [events[n] for n in kept]
            times = [impressions.timestamp_ms[n] for n in kept]
            for experiment in experiments:
                activity.expose(
                    state, experiment, new, times, counts, watermark_ms=self.watermark_ms
                )
        spans = impressions.items
        items = None if spans is None else spans.take(np.asarray(kept, dtype=np.int64))
        state.add_requests(list(fresh.values()), delay, items)

    def _ingest_interactions(self, interactions: InteractionBatch) -> None:
        state, counts = self.state, self.counts
        named_rid, loose_user = state.named_rid, state.loose_user
        loose_late_before = self._loose_late_before()
        events = interactions.events
        seen = state.were_seen([it.event_id for it in events])
        late_ids: list[str] = []  # loose ones counted late: marked seen after the loop
        late_ms: list[int] = []
        marking: set[str] = set()
        named_ids = list(dict.fromkeys(it.request_id for it in events if it.request_id))
        is_open = dict(zip(named_ids, state.requests.contains(named_ids), strict=True))
        # an open request has no marker (one with a marker is refused as a duplicate)
        closed = [rid for rid, known in is_open.items() if not known]
        marked: dict[str, int | None] = dict.fromkeys(named_ids)
        marked.update(zip(closed, state.markers.deadlines(closed), strict=True))
        late = _Late(state.markers, events, marked)
        relevant: list[tuple[str, str, int]] = []  # (user, event, time)
        times, grades = interactions.timestamp_ms, interactions.grade
        for n, (it, ts, grade) in enumerate(zip(events, times, grades, strict=True)):
            eid = it.event_id
            # held, applied or counted already, whoever's it was: replay's rule
            if eid in named_rid or seen[n] or eid in marking or eid in loose_user:
                counts.duplicates += 1
                continue
            marking.add(eid)  # its id reused later in the batch is a duplicate
            named = it.request_id
            if named and marked[named] is not None and not late.count(n):
                counts.duplicates += 1  # applied before (marked by an older version)
                continue
            if grade > 0:  # first seen, applied or late, as in replay's histories (they
                relevant.append((it.user_id, eid, ts))  # change after the loop)
            if named:
                if marked[named] is None:
                    state.add_named(
                        named, PendingInteraction(eid, it.item_id, ts, grade), is_open[named]
                    )
                else:
                    counts.late += 1
            elif ts < loose_late_before:
                late_ids.append(eid)
                late_ms.append(ts)
                counts.late += 1
            else:
                state.add_loose(it.user_id, PendingInteraction(eid, it.item_id, ts, grade))
        state.add_histories(relevant)
        state.mark_seen(late_ids, late_ms)
        late.record(events)

    def _loose_late_before(self) -> int:
        if self.watermark_ms is None:
            return -(2**62)
        return self.watermark_ms - self.config.horizon_ms

    # --- event time -------------------------------------------------------------

    def observe(self, name: str, max_event_ms: int | None, caught_up: bool, now_ms: int) -> None:
        """Progress of one input after a poll: the largest event time it delivered (None:
        nothing new) and whether the broker confirmed, at wall clock ``now_ms``, that
        its owner has consumed it to the end offset. It goes idle once such
        confirmations, with nothing new in between, span ``idle_timeout``."""
        clock = self.inputs.setdefault(name, InputClock())
        if max_event_ms is not None and (
            clock.max_event_ms is None or max_event_ms > clock.max_event_ms
        ):
            clock.max_event_ms = max_event_ms
        if max_event_ms is not None or not caught_up:
            # delivering, or behind: busy (a consumer keeping up with a live producer is
            # at the end after most polls, and must not count as idle)
            clock.caught_up_since_ms = clock.confirmed_ms = None
            return
        if clock.caught_up_since_ms is None:
            clock.caught_up_since_ms = now_ms
        clock.confirmed_ms = now_ms

    def advance(self, now_ms: int, limit_ms: int | None = None) -> int | None:
        """Move the watermark: the smallest event time over inputs that are not idle,
        minus the tolerated out-of-orderness. An input is idle once its live owner has
        been confirmed at its end offset, with nothing new, for ``idle_timeout``; when
        every input is idle the partition finalises by wall clock (``now_ms``).
        ``limit_ms``: it goes no further (other partitions may still forward events
        up to there). Never moves back."""
        times, seen = progress(self.inputs, self.config.idle_timeout_ms, self.config.eager)
        self.settled.update(times, seen)
        busy = list(times.values())
        if not self.inputs:
            return self.watermark_ms
        if busy:
            if any(t is None for t in busy):
                return self.watermark_ms
            base = min(t for t in busy if t is not None)
        else:
            base = max([*seen, now_ms])
        candidate = base - self.config.max_out_of_orderness_ms
        if self.own_ms is None or candidate > self.own_ms:
            self.own_ms = candidate
        if limit_ms is not None:
            if limit_ms <= HOLD_MS:  # other partitions' progress is unknown yet: hold
                return self.watermark_ms
            candidate = min(candidate, limit_ms)
        if self.watermark_ms is None or candidate > self.watermark_ms:
            self.watermark_ms = candidate
        return self.watermark_ms

    # --- finalisation -----------------------------------------------------------

    def due(self) -> int:
        """Open requests whose deadline the watermark has passed."""
        if self.watermark_ms is None:
            return 0
        return self.state.requests.count_due(self.watermark_ms - self.config.finalise.deadline(0))

    def finalise_due(self, configure: Configure | None = None) -> list[Finalised]:
        """Finalise every open request whose deadline the watermark has passed, then
        expire what can no longer join anything."""
        watermark = self.watermark_ms
        if watermark is None:
            return []
        state = self.state
        activity.release(state, watermark, self.counts.covariates)
        early = provisional_pass(state, self.config.finalise, watermark)
        self.counts.provisional = merge_increments([self.counts.provisional, early])
        table = state.requests
        due, places = table.due(watermark - self.config.finalise.deadline(0))
        out: list[Finalised] = []
        if len(due):
            due.named = named_columns(state, due.request_id)
            joined, history, loose_of = due_contexts(state, due.user_id)
            groups = configure(due) if configure else [(self.config.finalise, due)]
            book = table.book
            for config, group in groups:
                done = finalise(
                    group,
                    joined,
                    config,
                    self.partition,
                    history,
                    names=book.strings,
                    name_hashes=book.hashes(),
                )
                self.counts.outcomes.update(done.outcomes)
                done.experiment_rows = experiment_rows(
                    self.config.experiments, group.variant, group.ms
                )
                out.append(done)
            state.finish(
                due.request_id, (due.ms + self.config.finalise.deadline(0)).tolist(), places
            )
            self.counts.finalised += len(due)
            state.take_loose([loose_of[i] for done in out for i in done.loose_taken.tolist()])
        state.finalised_through(watermark)
        # markers and histories live for a TTL of the data's own time as every input has
        # delivered it (engine/clocks.py): not the wall clock an idle partition's
        # watermark follows, nor a backlog's leading topic
        data_ms = self.settled_ms()
        state.expire(watermark - self.config.horizon_ms, data_ms - self.config.finalised_ttl_ms)
        self._sweep_history(data_ms, watermark)
        self._end_experiments(data_ms)
        return out

    def _over(self, experiment: Experiment, data_ms: int) -> bool:
        """Whether an experiment ended a join horizon before the data's own time."""
        end = experiment.end_ms
        return end is not None and data_ms > end + self.config.horizon_ms

    def _end_experiments(self, data_ms: int) -> None:
        """Drop the exposure records of experiments that ended a horizon ago, by the
        data's own time (an idle partition's watermark follows the wall clock); checked
        once per experiment and engine, again after a reload."""
        for experiment in self.config.experiments:
            if experiment.name not in self._ended and self._over(experiment, data_ms):
                self.state.drop_exposures(experiment.name)
                self._ended.add(experiment.name)

    def idle(self) -> bool:
        """Whether every input is idle (the watermark follows the wall clock)."""
        idle_ms, eager = self.config.idle_timeout_ms, self.config.eager
        busy = (c.busy(0 if n in eager else idle_ms) for n, c in self.inputs.items())
        return bool(self.inputs) and not any(busy)

    def readout_ms(self) -> int | None:
        """The watermark, capped at the data's own time (minus the out-of-orderness)."""
        if self.watermark_ms is None:
            return None
        return min(self.watermark_ms, self.data_time_ms() - self.config.max_out_of_orderness_ms)

    def data_time_ms(self) -> int:
        """The largest event time consumed (the watermark before any)."""
        times = [c.max_event_ms for c in self.inputs.values() if c.max_event_ms is not None]
        return max(times) if times else (self.watermark_ms or 0)

    def settled_ms(self) -> int:
        """The event time every input has delivered up to (nothing expires before any)."""
        times, seen = progress(self.inputs, self.config.idle_timeout_ms, self.config.eager)
        settled = self.settled.update(times, seen)
        return settled if settled is not None else -(2**62)

    def _sweep_history(self, data_ms: int, watermark: int) -> None:
        """Expire cold-start histories past their TTL and activity past the CUPED
        lookback (behind the watermark: a pending exposure may still read it), once
        per TTL/10 of event time."""
        ttl = self.config.history_ttl_ms
        last = self._history_swept_ms
        if last is None or data_ms - last >= ttl // 10:  # also once after every load
            self.state.drop_history_before(data_ms - ttl)
            before = min(data_ms, watermark) // DAY_MS - self.state.lookback_days
            activity.expire(self.state, before)
            self._history_swept_ms = data_ms

    # --- checkpointing ----------------------------------------------------------

    def open_requests(self) -> int:
        return len(self.state.requests)

    def take(self) -> tuple[Changes, StepCounts]:
        """The changelog and counters since the last call (and forget them)."""
        counts, self.counts = self.counts, StepCounts()
        return self.state.flush(), counts

    def input_times(self) -> dict[str, int]:
        return {n: c.max_event_ms for n, c in self.inputs.items() if c.max_event_ms is not None}
