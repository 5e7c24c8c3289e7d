"""``evaluator run``: the composition root of the live pipeline (Kafka -> pipeline -> Redis)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

from evaluator.config import Settings
from evaluator.pipeline import PartitionBatch, Pipeline
from evaluator.sources.kafka import KafkaSource
from evaluator.stores.redis import RedisStore, connect
from evaluator.timeutil import parse_duration_ms

log = logging.getLogger("evaluator.run")

MAX_BACKOFF_S = 30.0


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
            source.commit()
            return True
        except Exception as exc:  # any failure: retry the batch, never commit
            log.error("batch failed, retrying in %.1fs without committing offsets: %s", delay, exc)
            stop.wait(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
    return False


def run(settings: Settings, stop: threading.Event | None = None) -> int:
    """Consume until stopped (SIGTERM/SIGINT), committing after each durable batch."""
    stop = stop or threading.Event()
    store = build_store(settings)
    pipeline = Pipeline(store, settings)
    source = KafkaSource(
        settings.kafka, parse_duration_ms(settings.kafka.poll_timeout), pipeline.register
    )
    log.info(
        "consuming %s and %s as group %s; state in Redis prefix %s",
        settings.kafka.impressions_topic,
        settings.kafka.interactions_topic,
        settings.kafka.group_id,
        settings.redis.key_prefix,
    )
    try:
        while not stop.is_set():
            batches = source.poll()
            if batches:
                if not _process_with_retry(pipeline, source, batches, stop):
                    break
                pipeline.touch(source.backlogged())
            else:
                try:
                    pipeline.finalise_due()
                except Exception as exc:  # retried on the next idle poll
                    log.error("finalisation failed, will retry: %s", exc)
                    time.sleep(0.5)
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
