"""``evaluator run``: the composition root of the live pipeline (Kafka -> pipeline -> Redis)."""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from evaluator.commands.serving import serve_metrics
from evaluator.config import Settings
from evaluator.pipeline import PartitionBatch, Pipeline, Prepared, Rejected
from evaluator.sources.kafka import KafkaSource
from evaluator.stores.base import StateStore
from evaluator.stores.redis import RedisStore, connect
from evaluator.timeutil import parse_duration_ms

log = logging.getLogger("evaluator.run")

MAX_BACKOFF_S = 30.0
ASSIGNMENT_TIMEOUT_S = 30.0
"""Rejoin the group when a rebalance produced no assignment for this long (a stall)."""


def build_store(settings: Settings) -> RedisStore:
    r, rules = settings.redis, settings.join.rules()
    client = connect(
        r.url,
        username=r.username,
        password=r.password,
        tls=r.tls,
        ca_certs=r.ssl_ca_certs,
        retries=r.retry_attempts,
        cluster=r.cluster,
    )
    store = RedisStore(
        client,
        settings.layout(),
        prefix=r.key_prefix,
        history_cap=settings.cold_start.min_relevant_history,
        state_ttl_s=r.ttl_s("state_ttl"),
        finalised_ttl_s=r.ttl_s("finalised_ttl"),
        propensity_history_ms=settings.propensity.history_ms(),
        attribute=settings.metrics.diversity_attribute,
        join_window_ms=rules.attribution_window_ms,
        clock_skew_ms=rules.max_clock_skew_ms,
    )
    store.check_layout()
    return store


def _apply_with_retry(
    pipeline: Pipeline, prepared: Prepared, backlogged: list[str], stop: threading.Event
) -> list[Rejected] | None:
    """Apply one prepared batch until it is durable; None if stopped first.

    Applying is idempotent, so retrying the whole batch after a failure is safe.
    """
    delay = 0.5
    while True:
        try:
            rejected = pipeline.apply(prepared)
            pipeline.touch(backlogged)
            return rejected
        except Exception as exc:  # any failure: retry the batch, never commit
            pipeline.stats.store_errors += 1
            log.error("batch failed, retrying in %.1fs without committing offsets: %s", delay, exc)
            if stop.wait(delay):
                return None
            delay = min(delay * 2, MAX_BACKOFF_S)


@dataclass(slots=True)
class _Applied:
    batches: list[PartitionBatch]
    rejected: list[Rejected] | None
    """None: not applied (stopped while retrying); its offsets stay uncommitted."""


class _Applier:
    """Applies prepared batches, in order, on one worker thread.

    The Redis round trips of batch N run there while the consumer thread polls,
    decodes and encodes batch N+1 (the waiting releases the GIL). Finished batches
    come back through :meth:`finished`; the consumer thread dead-letters and commits
    them, because kafka-python's consumer must stay on one thread.
    """

    def __init__(self, pipeline: Pipeline, stop: threading.Event, depth: int = 1) -> None:
        self.pipeline, self.stop = pipeline, stop
        self.todo: queue.Queue[tuple[list[PartitionBatch], Prepared, list[str]] | None] = (
            queue.Queue(maxsize=depth)
        )
        self.done: queue.Queue[_Applied] = queue.Queue()
        self.idle = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="apply", daemon=True)
        self.thread.start()

    def submit(self, batches: list[PartitionBatch], prepared: Prepared, busy: list[str]) -> None:
        """Queue a batch (blocks while the previous one is still waiting)."""
        self.todo.put((batches, prepared, busy))

    def _loop(self) -> None:
        while True:
            try:
                item = self.todo.get(timeout=0.2)
            except queue.Empty:
                self._finalise_idle()
                continue
            if item is None:
                return
            batches, prepared, busy = item
            self.done.put(
                _Applied(batches, _apply_with_retry(self.pipeline, prepared, busy, self.stop))
            )

    def _finalise_idle(self) -> None:
        """Nothing to apply: finalise what the watermark has passed (retried when idle)."""
        try:
            self.pipeline.finalise_due()
        except Exception as exc:
            self.pipeline.stats.store_errors += 1
            log.error("finalisation failed, will retry: %s", exc)
            self.stop.wait(0.5)

    def finished(self) -> list[_Applied]:
        out = []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> list[_Applied]:
        """Apply what is queued (once each), stop the thread, return the last results."""
        self.todo.put(None)
        self.thread.join()
        return self.finished()


def _commit(source: KafkaSource, pipeline: Pipeline, applied: list[_Applied]) -> None:
    """Dead-letter and commit applied batches, oldest first; stop at one not applied."""
    for done in applied:
        if done.rejected is None:
            return
        try:
            source.dead_letter(done.rejected)
            pipeline.stats.dead_lettered += len(done.rejected) if source.settings.dlq_suffix else 0
            source.commit(done.batches)
        except Exception as exc:  # redelivered later; applying it again is harmless
            pipeline.stats.store_errors += 1
            log.error("dead-lettering or committing failed; the batch will be redelivered: %s", exc)


class _Health:
    """Liveness and readiness as seen from the HTTP thread (no Kafka calls there)."""

    def __init__(self, store: StateStore, stall_after_s: float = 120.0) -> None:
        self.store = store
        self.stall_after_s = stall_after_s
        self.beat = time.monotonic()
        self.assigned: list[str] = []
        self.lag: dict[str, int] = {}
        self.kafka_error = ""
        """Why the last broker round trip (end offsets, every 5 s) failed; empty if it worked."""

    def alive(self) -> bool:
        return time.monotonic() - self.beat < self.stall_after_s

    def ready(self) -> tuple[bool, str]:
        try:
            ping = getattr(self.store, "ping", None)
            if ping is not None:
                ping()
        except Exception as exc:  # readiness reports any Redis failure
            return False, f"redis unreachable: {exc}"
        if self.kafka_error:
            return False, f"kafka unreachable: {self.kafka_error}"
        if not self.assigned:
            return False, "no Kafka partitions assigned"
        return True, f"ready: {len(self.assigned)} partitions"


def run(
    settings: Settings,
    stop: threading.Event | None = None,
    store: StateStore | None = None,
    truth: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """Consume until stopped (SIGTERM/SIGINT), committing after each durable batch.

    ``store`` defaults to Redis; the demo passes the embedded store and the
    simulator's ground truth for the dashboard."""
    stop = stop or threading.Event()
    store = store or build_store(settings)
    pipeline = Pipeline(store, settings)
    health = _Health(store)

    def on_assign(names: list[str]) -> None:
        health.assigned = names
        pipeline.register(names)

    source = KafkaSource(settings.kafka, parse_duration_ms(settings.kafka.poll_timeout), on_assign)
    serve_metrics(
        settings,
        store,
        pipeline,
        alive=health.alive,
        ready=health.ready,
        lag=lambda: health.lag,
        truth=truth,
    )
    log.info(
        "consuming %s and %s as group %s; state in Redis prefix %s",
        settings.kafka.impressions_topic,
        settings.kafka.interactions_topic,
        settings.kafka.group_id,
        settings.redis.key_prefix,
    )
    next_lag = 0.0
    applier = _Applier(pipeline, stop)
    try:
        while not stop.is_set():
            health.beat = time.monotonic()
            waiting = source.awaiting_since
            if waiting is not None and health.beat - waiting > ASSIGNMENT_TIMEOUT_S:
                log.warning(
                    "rebalance without an assignment for %.0fs: rejoining the group",
                    ASSIGNMENT_TIMEOUT_S,
                )
                source.subscribe()
                source.awaiting_since = health.beat
            batches = source.poll()
            _commit(source, pipeline, applier.finished())
            if batches:
                applier.submit(batches, pipeline.prepare(batches), source.backlogged())
            if time.monotonic() >= next_lag:
                try:
                    health.lag, health.kafka_error = source.lag(), ""
                except Exception as exc:  # reported by /readyz; polling retries by itself
                    health.kafka_error = str(exc) or type(exc).__name__
                next_lag = time.monotonic() + 5.0
    finally:
        _commit(source, pipeline, applier.close())
        source.close()
        store.close()
        log.info("stopped; finalised %d requests in this process", pipeline.stats.finalised)
    return 0


def install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: finishing the current batch, then stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
