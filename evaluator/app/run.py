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

from evaluator.adapters.kafka import KafkaSource
from evaluator.adapters.redis.store import RedisStore, connect
from evaluator.adapters.web.http import serve
from evaluator.app.serving import serve_metrics
from evaluator.config import ConfigError, Settings
from evaluator.core.timeutil import parse_duration_ms
from evaluator.engine.batches import Rejected
from evaluator.engine.ports import StateStore
from evaluator.engine.tasks import Tasks

log = logging.getLogger("evaluator.run")

MAX_BACKOFF_S = 30.0
ENDS_EVERY_S = 0.25
"""How often the broker is asked for end offsets (lag, and whether inputs are idle): each
answer is a confirmation that partitions waiting on forwarding bounds need, so it sets
how soon they finalise after a backlog. On a connection of its own, one costs ~1 ms."""
ASSIGNMENT_TIMEOUT_S = 30.0
"""Rejoin the group when a rebalance produced no assignment for this long (a stall), or
for twice the session timeout if longer: a rebalance waits that long for a dead member."""


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
        """Why the last broker round trip (end offsets, every 5 s) failed; empty if it worked."""

    def alive(self) -> bool:
        return time.monotonic() - self.beat < self.stall_after_s

    def ready(self) -> tuple[bool, str]:
        if self.waiting:
            return False, self.waiting
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
        return _claim(holder[0], numbers, stop)

    def on_revoke(numbers: list[int]) -> None:
        holder[0].revoke(numbers)

    early = serve_health(settings, health)
    try:
        source = wait_for(
            "Kafka",
            lambda: KafkaSource(
                settings.kafka,
                parse_duration_ms(settings.kafka.poll_timeout),
                on_assign,
                on_claim,
                on_revoke,
            ),
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
    tasks = Tasks(store, settings, partitions, write_behind=True)
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
        _loop(source, tasks, health, stop)
        _flush(source, tasks)
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


def _loop(source: KafkaSource, tasks: Tasks, health: Health, stop: threading.Event) -> None:
    """Poll, apply and checkpoint until stopped; a failed batch reloads the owned
    partitions from their checkpoints and consumes again from there."""
    next_lag = 0.0
    delay = 0.5
    committed: dict[int, dict[str, int]] = {}
    session_s = parse_duration_ms(source.settings.session_timeout) / 1000.0
    stall_s = max(ASSIGNMENT_TIMEOUT_S, 2 * session_s)
    while not stop.is_set():
        health.beat = time.monotonic()
        waiting = source.awaiting_since
        if waiting is not None and health.beat - waiting > stall_s:
            log.warning("rebalance without an assignment for %.0fs: rejoining the group", stall_s)
            source.subscribe()
            source.awaiting_since = health.beat
        try:
            batches = source.poll()
        except Exception as exc:  # the broker is unreachable: poll again after a pause
            health.kafka_error = str(exc) or type(exc).__name__
            log.error("polling failed, retrying in %.1fs: %s", delay, health.kafka_error)
            if stop.wait(delay):
                return
            delay = min(delay * 2, MAX_BACKOFF_S)
            continue
        held = set(tasks.owned)  # a partition dropped as stale mid-apply is still ours
        try:
            fenced, stale = tasks.apply(
                batches, source.caught_up(), _dead_letter(source, tasks), source.forward
            )
            if not batches:  # idle: no next poll to overlap the checkpoints with
                tasks.settle()  # durable now, so the offsets below are committed now
            delay = 0.5
        except Exception as exc:  # the store or the DLQ failed: resume from checkpoints
            tasks.stats.store_errors += 1
            log.error("batch failed; reloading partitions from their checkpoints: %s", exc)
            # their state in memory is not whole: nothing may checkpoint it (not the
            # stop below, nor a revocation while waiting)
            tasks.revoke(list(held), flush=False)
            if stop.wait(delay):
                return
            delay = min(delay * 2, MAX_BACKOFF_S)
            fenced, stale = [], sorted(held)
        # partitions whose checkpoint raised outside apply (written behind, settled
        # during a rebalance) reload too; only those still assigned to this member
        assigned = source.assigned_numbers()
        stale = sorted((set(stale) | tasks.take_dropped()) & assigned)
        if fenced:
            source.pause(fenced)
        if stale:
            source.seek(_claim(tasks, stale, stop))
        durable = {p: dict(o.durable) for p, o in tasks.owned.items()}
        if durable != committed:  # only what a checkpoint moved
            source.commit_offsets(durable)
            committed = durable
        if time.monotonic() >= next_lag:
            _refresh_ends(source, health)
            next_lag = time.monotonic() + ENDS_EVERY_S


def _refresh_ends(source: KafkaSource, health: Health) -> None:
    """Ask the broker for the end offsets: they confirm which inputs are consumed to
    their end (idleness, forwarding bounds) and give the lag."""
    try:
        source.refresh_ends()
        health.lag, health.kafka_error = source.lag(), ""
    except Exception as exc:  # reported by /readyz; polling retries by itself
        health.kafka_error = str(exc) or type(exc).__name__


def _flush(source: KafkaSource, tasks: Tasks) -> None:
    """A clean stop writes what was done since the last checkpoints (a failure here only
    means the next owner redoes that work)."""
    try:
        tasks.flush()
        source.commit_offsets({p: dict(o.durable) for p, o in tasks.owned.items()})
    except Exception as exc:
        log.warning("no final checkpoint: %s", exc)


def _dead_letter(source: KafkaSource, tasks: Tasks) -> Callable[[list[Rejected]], None]:
    def send(rejected: list[Rejected]) -> None:
        source.dead_letter(rejected)
        tasks.stats.dead_lettered += len(rejected) if source.settings.dlq_suffix else 0

    return send


def _claim(tasks: Tasks, numbers: list[int], stop: threading.Event) -> dict[int, dict[str, int]]:
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


def install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: finishing the current batch, then stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
