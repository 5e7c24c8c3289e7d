"""``evaluator run``: the composition root of the live pipeline (Kafka -> pipeline -> Redis)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from types import FrameType
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from evaluator.adapters.redis.store import RedisStore, connect
from evaluator.adapters.web.http import serve
from evaluator.app.serving import serve_metrics
from evaluator.config import ConfigError, Settings
from evaluator.config.plain import tasks_config
from evaluator.core.timeutil import parse_duration_ms
from evaluator.engine.loop import MAX_BACKOFF_S, Health, claim, consume
from evaluator.engine.ports import Source, StateStore
from evaluator.engine.tasks import Tasks

log = logging.getLogger("evaluator.run")


def make_source(
    settings: Settings,
    on_assign: Callable[[list[str]], None],
    on_claim: Callable[[list[int]], dict[int, dict[str, int]]],
    on_revoke: Callable[[list[int]], None],
) -> Source:
    """The Kafka source of ``kafka.client``: kafka-python (the default) or
    confluent-kafka (librdkafka; the optional ``confluent`` extra)."""
    poll_ms = parse_duration_ms(settings.kafka.poll_timeout)
    if settings.kafka.client == "confluent":
        try:
            from evaluator.adapters.confluent import ConfluentSource
        except ImportError as exc:
            raise ConfigError(
                "kafka.client = confluent needs confluent-kafka: "
                f"pip install 'recsys-evaluator[confluent]' ({exc})"
            ) from None
        return ConfluentSource(settings.kafka, poll_ms, on_assign, on_claim, on_revoke)
    from evaluator.adapters.kafka import KafkaSource

    return KafkaSource(settings.kafka, poll_ms, on_assign, on_claim, on_revoke)


def build_store(settings: Settings, partitions: int | None = None) -> RedisStore:
    r = settings.redis
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
        settings.layout(partitions),
        prefix=r.key_prefix,
        propensity_history_ms=settings.propensity.history_ms(),
    )
    store.check_layout()
    return store


def run(
    settings: Settings,
    stop: threading.Event | None = None,
    make_store: Callable[[int], StateStore] | None = None,
    truth: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """Consume until stopped (SIGTERM/SIGINT), checkpointing each owned partition after
    each poll.

    ``make_store`` (partition count -> store) defaults to Redis; the demo passes the
    embedded store and the simulator's ground truth for the dashboard."""
    stop = stop or threading.Event()
    holder: list[Tasks] = []
    health = Health(None)

    def on_assign(names: list[str]) -> None:
        health.assigned = names

    def on_claim(numbers: list[int]) -> dict[int, dict[str, int]]:
        return claim(holder[0], numbers, stop)

    def on_revoke(numbers: list[int]) -> None:
        holder[0].revoke(numbers)

    early = serve_health(settings, health)
    try:
        source = wait_for(
            "Kafka",
            lambda: make_source(settings, on_assign, on_claim, on_revoke),
            stop,
            health,
        )
        if source is None:
            return 0
        partitions = source.partition_count()
        build = make_store or (lambda n: build_store(settings, n))
        store = wait_for("Redis", lambda: build(partitions), stop, health)
        if store is None:
            source.close()
            return 0
    finally:
        if early is not None:  # the full server takes the port over
            early.shutdown()
            early.server_close()
    health.waiting = ""
    tasks = Tasks(store, tasks_config(settings, partitions), write_behind=True)
    holder.append(tasks)
    health.store = store
    serve_metrics(
        settings,
        store,
        tasks,
        alive=health.alive,
        ready=health.ready,
        lag=lambda: health.lag,
        truth=truth,
    )
    log.info(
        "consuming %s and %s (%d partitions each) as group %s; state in Redis prefix %s",
        settings.kafka.impressions_topic,
        settings.kafka.interactions_topic,
        partitions,
        settings.kafka.group_id,
        settings.redis.key_prefix,
    )
    source.subscribe()
    try:
        consume(source, tasks, health, stop)
    finally:
        source.close()
        store.close()
        log.info("stopped; finalised %d requests in this process", tasks.stats.finalised)
    return 0


T = TypeVar("T")


def wait_for(
    what: str, attempt: Callable[[], T], stop: threading.Event, health: Health
) -> T | None:
    """``attempt()`` until it works, one log line per failure and an exponential backoff;
    None when stopped meanwhile. A configuration error (unknown host, refused
    credentials) is raised at once: retrying cannot fix it."""
    delay = 1.0
    health.waiting = f"connecting to {what}"
    while True:
        health.beat = time.monotonic()
        try:
            return attempt()
        except ConfigError:
            raise
        except Exception as exc:  # unreachable: not ready, and try again
            reason = " ".join((str(exc) or type(exc).__name__).split())[:300]
            health.waiting = f"waiting for {what}: {reason}"
            log.error("%s unreachable, retrying in %.0fs: %s", what, delay, reason)
        if stop.wait(delay):
            return None
        delay = min(delay * 2, MAX_BACKOFF_S)


def serve_health(settings: Settings, health: Health) -> ThreadingHTTPServer | None:
    """/healthz (alive) and /readyz (not ready, with what start-up waits for) while the
    services are not reachable yet."""
    if not settings.http.port:
        return None
    return serve(
        CollectorRegistry(),
        settings.http.host,
        settings.http.port,
        alive=health.alive,
        ready=health.ready,
    )


def install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: finishing the current batch, then stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
