"""Partition tasks: the live path from polled batches to checkpoints.

One :class:`~evaluator.engine.partition.PartitionEngine` per owned partition
number (a user's impressions and interactions share it). Per poll, each owned
partition decodes its batches, joins and finalises in memory, then writes one
atomic checkpoint (changelog delta, offsets, event time, counters, aggregate
increments) that the store accepts only from the partition's current owner;
``evaluator run`` writes a poll's checkpoints behind the next poll
(:mod:`evaluator.engine.writebehind`). A
stale owner (fenced) drops the partition; its records are the new owner's to
process from the checkpointed offsets, so nothing is lost or counted twice.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence

from evaluator.core.events import InvalidReason
from evaluator.engine.batches import PartitionBatch, PipelineStats, Rejected, wall_clock_ms
from evaluator.engine.bounds import ForwardingBounds, fresher
from evaluator.engine.checkpoint import Delta, Marks, Outcome
from evaluator.engine.curves import BucketCurves
from evaluator.engine.owned import Owned
from evaluator.engine.partition import PartitionEngine
from evaluator.engine.partitioner import PartitionOf
from evaluator.engine.plan import TasksConfig
from evaluator.engine.ports import StateStore
from evaluator.engine.restore import restore_state
from evaluator.engine.routing import Decoder, Forwarded, refused_letters
from evaluator.engine.runtime import long_lived
from evaluator.engine.writebehind import Write, WriteBehind, Written, write_all

log = logging.getLogger(__name__)


MAX_PENDING_FIELDS = 200_000
"""A partition checkpoints before its interval once this many changelog fields and
segment rows wait to be written."""


def partition_number(name: str) -> int:
    return int(name.rsplit(":", 1)[1])


class Tasks:
    """The partitions this process owns (see the module docstring)."""

    def __init__(
        self,
        store: StateStore,
        config: TasksConfig,
        clock_ms: Callable[[], int] = wall_clock_ms,
        write_behind: bool = False,
    ) -> None:
        """``write_behind``: a poll's checkpoints are written on a thread while the next
        poll is processed (``evaluator run``); otherwise before :meth:`apply` returns."""
        plan = config.over(store.layout)
        self.store = store
        self.partitions = plan.partitions
        self.config = plan.engine
        self.interval_ms = plan.checkpoint_interval_ms
        self.clock_ms = clock_ms
        self.stats = PipelineStats()
        self.owned: dict[int, Owned] = {}
        self.curves = BucketCurves(
            store, self.config.finalise, plan.estimating, lambda: self.stats.finalised
        )
        self.decoder = Decoder(
            PartitionOf(plan.partitioner, plan.partitions),
            plan.relevance,
            plan.max_list_length,
            plan.max_future_ms,
        )
        self._pending: dict[int, list[bytes]] = {}
        self._local_offsets: dict[int, int] = {}
        self.bounds = ForwardingBounds(self._marks, self.config.idle_timeout_ms)
        self._writer: WriteBehind[Written] | None = (
            WriteBehind("checkpoints") if write_behind else None
        )
        self._fenced: list[int] = []
        self._stale: list[int] = []
        self._error: Exception | None = None
        """A write in flight that raised, for the next :meth:`apply` to raise."""
        self.dropped: set[int] = set()
        """Partitions dropped because their checkpoint raised (their changes were taken):
        the caller reloads them once it has handled the error."""

    # --- ownership --------------------------------------------------------------

    def assign(self, partitions: Collection[int]) -> dict[int, dict[str, int]]:
        """Claim partitions (fencing earlier owners) and load their state; returns each
        one's stored offsets, where consumption must resume."""
        self._settle()
        resume: dict[int, dict[str, int]] = {}
        claimed = set(partitions)
        # dropped earlier (fenced or stale) and ours again now: not to be paused or
        # reloaded on that account
        self._fenced = [p for p in self._fenced if p not in claimed]
        self._stale = [p for p in self._stale if p not in claimed]
        for p in sorted(claimed):
            self.bounds.forget(p)  # the new engine is behind its repartition input again
            started = time.perf_counter()
            with long_lived():
                stored = self.store.claim(p)
                state = restore_state(
                    stored.fields, self.config.finalise.deadline, self.config.history_cap
                )
            engine = PartitionEngine(p, self.config, state, stored.watermark_ms, stored.times)
            self.owned[p] = Owned(
                engine,
                stored.epoch,
                stored.seq,
                dict(stored.offsets),
                (stored.watermark_ms, stored.watermark_ms),
                durable=dict(stored.offsets),
            )
            resume[p] = dict(stored.offsets)
            log.info(
                "partition %d: epoch %d, %d open requests loaded in %.2fs, resuming at %s",
                p,
                stored.epoch,
                engine.open_requests(),
                time.perf_counter() - started,
                stored.offsets or "the committed or reset offsets",
            )
        return resume

    def revoke(self, partitions: Collection[int], flush: bool = True) -> None:
        """Release partitions, first checkpointing what they did since the last
        checkpoint (``flush``; not after a failed batch, whose state is not whole). A
        failed checkpoint only means the next owner redoes that work."""
        self._settle()  # the checkpoints in flight come first
        for p in partitions:
            if flush and p in self.owned:
                try:
                    self._checkpoint(p, self.owned[p])
                except Exception as exc:  # the store is unreachable: nothing is lost
                    log.warning("partition %d: no checkpoint before release: %s", p, exc)
            if self.owned.pop(p, None) is not None:
                log.info("partition %d released", p)

    def flush(self) -> None:
        """Checkpoint every owned partition now (before a clean shutdown)."""
        self.settle()
        for p, owned in list(self.owned.items()):
            self._checkpoint(p, owned)

    def watermark(self) -> int | None:
        """The smallest watermark of the owned partitions (this process's event time)."""
        marks = [o.engine.watermark_ms for o in self.owned.values()]
        known = [m for m in marks if m is not None]
        return min(known) if known else None

    # --- processing -------------------------------------------------------------

    def _forward_locally(self, forwarded: list[Forwarded]) -> list[Forwarded]:
        """Without a repartition topic (the demo, tests): hand forwarded events straight
        to the owning partition's next batch."""
        for f in forwarded:
            self._pending.setdefault(f.partition, []).append(f.payload)
        return []

    def apply(
        self,
        batches: Sequence[PartitionBatch],
        caught_up: Mapping[str, int],
        dead_letter: Callable[[list[Rejected]], None] = lambda rejected: None,
        forward: Callable[[list[Forwarded]], list[Forwarded]] | None = None,
    ) -> tuple[list[int], list[int]]:
        """Join, finalise and checkpoint every owned partition (those without new
        records too: their event time may advance by idleness). ``caught_up``: inputs
        (``impressions:3``) the broker confirmed consumed to their end offset, with the
        wall clock (ms) of that confirmation. Invalid messages go to
        ``dead_letter``, and events of other partitions' users to ``forward``, before the
        checkpoint that moves past them. Returns the
        partitions lost to a newer owner (fenced) and those whose stored state went
        back (Redis lost writes): the caller reloads those with :meth:`assign`."""
        started = time.perf_counter()
        now = self.clock_ms()
        if forward is None:  # no repartition topic: its local stand-in is at its end
            local = {f"repartition:{p}": now for p in self.owned if p not in self._pending}
            caught_up = {**local, **caught_up}
            forward = self._forward_locally
        grouped: dict[int, list[PartitionBatch]] = defaultdict(list)
        for batch in batches:
            grouped[partition_number(batch.partition)].append(batch)
        for p, payloads in self._pending.items():  # forwarded locally in the last call
            first = self._local_offsets.get(p, 0)
            self._local_offsets[p] = first + len(payloads)
            offsets = range(first, first + len(payloads))
            grouped[p].append(PartitionBatch("repartition", f"repartition:{p}", payloads, offsets))
        self._pending = {}
        limits = self._limits(caught_up, now)
        due: list[int] = []
        for p, owned in list(self.owned.items()):
            mine = grouped.get(p, [])
            rejected, forwarded = self._ingest(owned, mine, caught_up, now, limits.get(p))
            if rejected:
                dead_letter(rejected)
            if forwarded:  # durable in the repartition topic before the checkpoint
                refused = forward(forwarded)
                if refused:  # too large for the repartition topic: never accepted
                    letters = refused_letters(refused)
                    self.stats.invalid[InvalidReason.TOO_LARGE_TO_FORWARD.value] += len(letters)
                    dead_letter(letters)
                self.stats.repartitioned += len(forwarded) - len(refused)
                if len(refused) < len(forwarded):  # other partitions wait for these
                    owned.forwarded_ms = now
            owned.done += owned.engine.finalise_due(self.curves.group)
            owned.consumed = owned.consumed or bool(mine)
            if forwarded or self._checkpoint_due(owned, now):
                due.append(p)
        self.settle()  # the last poll's checkpoints: one partition's writes stay in order
        writes = [w for p in due if p in self.owned and (w := self._take(p, self.owned[p]))]
        if self._writer is not None:
            if writes:
                self._writer.submit(lambda: write_all(self.store, writes))
        else:
            self._write_now(writes)
        self.stats.latency.observe(time.perf_counter() - started)
        fenced, stale, self._fenced, self._stale = self._fenced, self._stale, [], []
        return fenced, stale

    def _ingest(
        self,
        owned: Owned,
        batches: list[PartitionBatch],
        caught_up: Mapping[str, int],
        now: int,
        limit: int | None,
    ) -> tuple[list[Rejected], list[Forwarded]]:
        """Feed one partition's new records to its engine and advance its event time;
        returns the invalid messages and the events to forward to other partitions."""
        engine = owned.engine
        rejected: list[Rejected] = []
        forwarded: list[Forwarded] = []
        latest: dict[str, int | None] = {}
        for batch in batches:
            if batch.offsets is None or not batch.payloads:
                continue
            # records before the checkpointed offset were applied already
            first = bisect.bisect_left(batch.offsets, owned.offsets.get(batch.kind, 0))
            if first == len(batch.payloads):
                continue
            self.stats.consumed[batch.kind] += len(batch.payloads) - first
            routed = self.decoder.route(batch, first, engine.partition, now)
            engine.ingest(routed.impressions, routed.interactions)
            for bad in routed.rejected:
                self.stats.invalid[bad.event.reason.value] += 1
            rejected += routed.rejected
            forwarded += routed.forwarded
            latest[batch.kind] = routed.latest_ms()
            owned.offsets[batch.kind] = batch.offsets[-1] + 1
        p = engine.partition
        for name in self.config.inputs:
            confirmed = caught_up.get(f"{name}:{p}")
            engine.observe(name, latest.get(name), confirmed is not None, confirmed or now)
        engine.advance(now, limit)
        return rejected, forwarded

    def _limits(self, caught_up: Mapping[str, int], now: int) -> dict[int, int]:
        """How far each owned partition may finalise while events may be forwarded
        (:mod:`evaluator.engine.bounds`); none with producers trusted to key by user."""
        if not self.decoder.partition_of.checks:
            return {}
        return self.bounds.limits(self.owned.keys(), caught_up, now)

    def _marks(self) -> dict[int, Marks]:
        """Every partition's marks, this process's own partitions as they are now."""
        local = {p: Marks(o.engine.own_ms, o.forwarded_ms) for p, o in self.owned.items()}
        return fresher(self.store.marks(), local)

    def _checkpoint_due(self, owned: Owned, now: int) -> bool:
        """Whether to checkpoint after this poll: every ``engine.checkpoint_interval``,
        through a backlog and at the end of the inputs alike (requests opened and
        finalised in between never reach the store, and the aggregate increments of
        several polls go in one write: keeping up with live traffic, a poll brings a
        few events, and a checkpoint after each cost ~15% more CPU), or when much
        waits to be written. (One that forwarded events checkpoints at once: its mark
        tells the other partitions to wait for them.)"""
        last = owned.checkpointed_ms
        return (
            last is None
            or now - last >= self.interval_ms
            or owned.engine.state.unwritten() >= MAX_PENDING_FIELDS
        )

    def _checkpoint(self, p: int, owned: Owned) -> Outcome:
        """Write the partition's checkpoint now (skipped when nothing changed); raises
        what the store raised."""
        write = self._take(p, owned)
        if write is None:
            return Outcome.WRITTEN
        return self._write_now([write]).outcomes[0][1]

    def _write_now(self, writes: list[Write]) -> Written:
        """Write checkpoints on this thread and take in their outcomes; raises what the
        store raised."""
        written = write_all(self.store, writes)
        self._conclude(written)
        if written.error is not None:
            raise written.error
        return written

    def _take(self, p: int, owned: Owned) -> Write | None:
        """The partition's checkpoint: its changelog, offsets, event time and the
        requests finalised since the last one (None when nothing changed). Taken from the
        engine: from here it exists only in the write, so a write that fails drops the
        partition."""
        engine = owned.engine
        done, owned.done = owned.done, []
        changes, counts = engine.take()
        consumed, owned.consumed = owned.consumed, False
        moved = (engine.watermark_ms, engine.own_ms) != owned.written_marks
        owned.checkpointed_ms = self.clock_ms()
        if not (consumed or changes or done or counts.duplicates or counts.late or moved):
            return None
        delta = Delta(
            changes,
            {"finalised": counts.finalised, "duplicates": counts.duplicates, "late": counts.late},
            dict(owned.offsets),
            engine.input_times(),
            engine.watermark_ms,
            engine.open_requests(),
            engine.readout_ms(),
            done,
            engine.own_ms,
            owned.forwarded_ms,
            dict(counts.exposures),
            counts.covariates,
            counts.provisional,
        )
        seq, owned.seq = owned.seq, owned.seq + 1  # the next write follows this one
        owned.written_marks = (engine.watermark_ms, engine.own_ms)
        return Write(p, owned, seq, delta, counts)

    def settle(self) -> None:
        """Wait for the checkpoints written behind, if any; raises what they raised."""
        self._settle()
        self._raise_error()

    def _settle(self) -> None:
        """Wait for the checkpoints in flight, if any, and take in their outcomes."""
        if self._writer is None:
            return
        written, error = self._writer.settle()
        if error is not None:  # not an Exception (e.g. MemoryError): nothing to recover
            raise error
        if written is not None:
            self._conclude(written)
            if written.error is not None and self._error is None:
                self._error = written.error

    def _conclude(self, written: Written) -> None:
        """Take in what became of checkpoints: offsets durable and counters counted, or
        the partition dropped (fenced: a newer owner has it; stale: the store lost
        writes; raised: what was taken for the write now exists nowhere, and may or may
        not have reached the store, so only a reload may continue)."""
        for w, outcome in written.outcomes:
            p, owned, counts = w.partition, w.owned, w.counts
            if outcome is Outcome.WRITTEN:
                owned.durable = dict(w.delta.offsets)
                self.stats.finalised += counts.finalised
                self.stats.duplicates += counts.duplicates
                self.stats.late += counts.late
                self.stats.outcomes.update(counts.outcomes)
                continue
            self._drop(p, owned)
            if outcome is Outcome.FENCED:
                log.warning("partition %d: claimed by a newer owner; dropping it", p)
                self._fenced.append(p)
            else:
                log.warning("partition %d: the stored state went back (lost writes?); reloading", p)
                self._stale.append(p)
        for w in written.failed:
            if self._drop(w.partition, w.owned):
                self.dropped.add(w.partition)

    def _drop(self, p: int, owned: Owned) -> bool:
        """Forget a partition if ``owned`` is still how it is held (not since reloaded)."""
        if self.owned.get(p) is owned:
            del self.owned[p]
            return True
        return False

    def take_dropped(self) -> set[int]:
        """Partitions dropped since the last call because their checkpoint raised."""
        dropped, self.dropped = self.dropped, set()
        return dropped

    def _raise_error(self) -> None:
        """Raise what a checkpoint written behind raised (once)."""
        error, self._error = self._error, None
        if error is not None:
            raise error
