"""``evaluator run``: the composition root of the live pipeline (Kafka -> pipeline -> Redis)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from evaluator.commands.serving import serve_metrics
from evaluator.config import Settings
from evaluator.pipeline import PartitionBatch, Pipeline
from evaluator.sources.kafka import KafkaSource
from evaluator.stores.base import StateStore
from evaluator.stores.redis import RedisStore, connect
from evaluator.timeutil import parse_duration_ms

log = logging.getLogger("evaluator.run")

MAX_BACKOFF_S = 30.0
ASSIGNMENT_TIMEOUT_S = 30.0
"""Rejoin the group when a rebalance produced no assignment for this long (a stall)."""


def build_store(settings: Settings) -> RedisStore:
    r = settings.redis
    client = connect(
        r.url,
        username=r.username,
        password=r.password,
        tls=r.tls,
        ca_certs=r.ssl_ca_certs,
        retries=r.retry_attempts,
    )
    store = RedisStore(
        client,
        settings.layout(),
        prefix=r.key_prefix,
        history_cap=settings.cold_start.min_relevant_history,
        attribute=settings.metrics.diversity_attribute,
    )
    store.check_layout()
    return store


def _process_with_retry(
    pipeline: Pipeline, source: KafkaSource, batches: list[PartitionBatch], stop: threading.Event
) -> bool:
    """Process one polled batch until it is durable; False if stopped first.

    Processing is idempotent, so retrying the whole batch after a failure is safe.
    Offsets are committed only after success.
    """
    delay = 0.5
    while not stop.is_set():
        try:
            rejected = pipeline.process(batches)
            source.dead_letter(rejected)
            pipeline.stats.dead_lettered += len(rejected) if source.settings.dlq_suffix else 0
            source.commit()
            return True
        except Exception as exc:  # any failure: retry the batch, never commit
            pipeline.stats.store_errors += 1
            log.error("batch failed, retrying in %.1fs without committing offsets: %s", delay, exc)
            stop.wait(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
    return False


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
            if batches:
                if not _process_with_retry(pipeline, source, batches, stop):
                    break
                pipeline.touch(source.backlogged())
            else:
                try:
                    pipeline.finalise_due()
                except Exception as exc:  # retried on the next idle poll
                    pipeline.stats.store_errors += 1
                    log.error("finalisation failed, will retry: %s", exc)
                    stop.wait(0.5)
            if time.monotonic() >= next_lag:
                try:
                    health.lag, health.kafka_error = source.lag(), ""
                except Exception as exc:  # reported by /readyz; polling retries by itself
                    health.kafka_error = str(exc) or type(exc).__name__
                next_lag = time.monotonic() + 5.0
    finally:
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
