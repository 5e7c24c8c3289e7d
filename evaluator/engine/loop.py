"""The live loop: poll a :class:`~evaluator.engine.ports.Source`, apply the batches to
the owned partitions, checkpoint, commit; and the health it reports.

A failed batch reloads the owned partitions from their checkpoints and consumes
again from there, so a store or broker failure never loses or doubles an event.
``evaluator run`` composes it with a Kafka source (either client) and a store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from evaluator.engine.batches import PartitionBatch, Rejected
from evaluator.engine.ports import Source, StateStore
from evaluator.engine.tasks import Tasks

log = logging.getLogger("evaluator.run")

MAX_BACKOFF_S = 30.0
ENDS_EVERY_S = 0.25
"""How often the broker is asked for end offsets (lag, and whether inputs are idle): each
answer is a confirmation that partitions waiting on forwarding bounds need, so it sets
how soon they finalise after a backlog. On a connection of its own, one costs ~1 ms."""
IDLE_WAIT_MS = 1_000
"""The longest a poll waits for records once every owned partition is idle (its inputs
at their end for ``idle_timeout``): a record still ends the wait at once, and nothing
waits on confirmations or the wall clock more often than the checkpoints. An idle
process then used a third of the CPU it did polling every ``kafka.poll_timeout``
(BENCHMARKS.md, session 38). A stop waits as long at most."""
ASSIGNMENT_TIMEOUT_S = 30.0
"""Rejoin the group when a rebalance produced no assignment for this long (a stall), or
for twice the session timeout if longer: a rebalance waits that long for a dead member."""


class Health:
    """Liveness and readiness as seen from the HTTP thread (no Kafka calls there)."""

    def __init__(self, store: StateStore | None, stall_after_s: float = 120.0) -> None:
        self.store = store
        self.stall_after_s = stall_after_s
        self.beat = time.monotonic()
        self.waiting = ""
        """What start-up is waiting for (a service that does not answer yet); empty once
        connected."""
        self.assigned: list[str] = []
        self.lag: dict[str, int] = {}
        self.kafka_error = ""
        """Why the last broker round trip (end offsets) failed; empty if it worked."""

    def alive(self) -> bool:
        return time.monotonic() - self.beat < self.stall_after_s

    def ready(self) -> tuple[bool, str]:
        if self.waiting:
            return False, self.waiting
        try:
            if self.store is not None:
                self.store.ping()
        except Exception as exc:  # readiness reports any store failure
            return False, f"redis unreachable: {exc}"
        if self.kafka_error:
            return False, f"kafka unreachable: {self.kafka_error}"
        if not self.assigned:
            return False, "no Kafka partitions assigned"
        return True, f"ready: {len(self.assigned)} partitions"


def consume(source: Source, tasks: Tasks, health: Health, stop: threading.Event) -> None:
    """Poll, apply and checkpoint until stopped, then write what is pending."""
    _loop(source, tasks, health, stop)
    flush(source, tasks)


def _loop(source: Source, tasks: Tasks, health: Health, stop: threading.Event) -> None:
    next_lag = 0.0
    delay = 0.5
    committed: dict[int, dict[str, int]] = {}
    stall_s = max(ASSIGNMENT_TIMEOUT_S, 2 * source.session_timeout_s)
    while not stop.is_set():
        health.beat = time.monotonic()
        waiting = source.awaiting_since
        if waiting is not None and health.beat - waiting > stall_s:
            log.warning("rebalance without an assignment for %.0fs: rejoining the group", stall_s)
            source.subscribe()
            source.awaiting_since = health.beat
        try:
            batches = source.poll(idle_wait_ms(tasks))
        except Exception as exc:  # the broker is unreachable: poll again after a pause
            health.kafka_error = str(exc) or type(exc).__name__
            log.error("polling failed, retrying in %.1fs: %s", delay, health.kafka_error)
            if stop.wait(delay):
                return
            delay = min(delay * 2, MAX_BACKOFF_S)
            continue
        stale, delay = _apply(source, tasks, batches, stop, delay)
        if stale is None:
            return
        # partitions whose checkpoint raised outside apply (written behind, settled
        # during a rebalance) reload too; only those still assigned to this member
        assigned = source.assigned_numbers()
        stale = sorted((set(stale) | tasks.take_dropped()) & assigned)
        if stale:
            source.seek(claim(tasks, stale, stop))
        durable = {p: dict(o.durable) for p, o in tasks.owned.items()}
        if durable != committed:  # only what a checkpoint moved
            source.commit_offsets(durable)
            committed = durable
        if time.monotonic() >= next_lag:
            refresh_ends(source, health)
            next_lag = time.monotonic() + ENDS_EVERY_S


def idle_wait_ms(tasks: Tasks) -> int | None:
    """How long the next poll may wait when every owned partition is idle: until the
    first checkpoint is due (an idle partition's watermark follows the wall clock), at
    most :data:`IDLE_WAIT_MS`; None otherwise (the configured ``kafka.poll_timeout``)."""
    owned = list(tasks.owned.values())
    if not owned or not all(o.engine.idle() for o in owned):
        return None
    now = tasks.clock_ms()
    last = [now if o.checkpointed_ms is None else o.checkpointed_ms for o in owned]
    due = min(last) + tasks.interval_ms - now
    return min(max(due, 0), IDLE_WAIT_MS)


def _apply(
    source: Source,
    tasks: Tasks,
    batches: list[PartitionBatch],
    stop: threading.Event,
    delay: float,
) -> tuple[list[int] | None, float]:
    """Apply one poll; the partitions to reload (None: stopped while backing off) and
    the next backoff."""
    held = set(tasks.owned)  # a partition dropped as stale mid-apply is still ours
    try:
        fenced, stale = tasks.apply(
            batches, source.caught_up(), dead_letter(source, tasks), source.forward
        )
        if not batches:  # idle: no next poll to overlap the checkpoints with
            tasks.settle()  # durable now, so the offsets below are committed now
    except Exception as exc:  # the store or the DLQ failed: resume from checkpoints
        tasks.stats.store_errors += 1
        log.error("batch failed; reloading partitions from their checkpoints: %s", exc)
        # their state in memory is not whole: nothing may checkpoint it (not the
        # stop below, nor a revocation while waiting)
        tasks.revoke(list(held), flush=False)
        if stop.wait(delay):
            return None, delay
        return sorted(held), min(delay * 2, MAX_BACKOFF_S)
    if fenced:
        source.pause(fenced)
    return stale, 0.5


def refresh_ends(source: Source, health: Health) -> None:
    """Ask the broker for the end offsets: they confirm which inputs are consumed to
    their end (idleness, forwarding bounds) and give the lag."""
    try:
        source.refresh_ends()
        health.lag, health.kafka_error = source.lag(), ""
    except Exception as exc:  # reported by /readyz; polling retries by itself
        health.kafka_error = str(exc) or type(exc).__name__


def flush(source: Source, tasks: Tasks) -> None:
    """A clean stop writes what was done since the last checkpoints (a failure here only
    means the next owner redoes that work)."""
    try:
        tasks.flush()
        source.commit_offsets({p: dict(o.durable) for p, o in tasks.owned.items()})
    except Exception as exc:
        log.warning("no final checkpoint: %s", exc)


def dead_letter(source: Source, tasks: Tasks) -> Callable[[list[Rejected]], None]:
    def send(rejected: list[Rejected]) -> None:
        source.dead_letter(rejected)
        tasks.stats.dead_lettered += len(rejected) if source.dead_letters else 0

    return send


def claim(tasks: Tasks, numbers: list[int], stop: threading.Event) -> dict[int, dict[str, int]]:
    """Claim partitions, retrying with backoff while the store is unreachable."""
    delay = 0.5
    while True:
        try:
            return tasks.assign(numbers)
        except Exception as exc:
            tasks.stats.store_errors += 1
            log.error("claiming partitions %s failed, retrying in %.1fs: %s", numbers, delay, exc)
            if stop.wait(delay):
                return {}
            delay = min(delay * 2, MAX_BACKOFF_S)
