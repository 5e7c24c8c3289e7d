"""Exactly once under failover, against the real broker and Redis.

Two ``evaluator run`` instances share a group on topics with 3 partitions keyed by
user id; events are produced at 2,000 events/s while one instance dies (SIGKILL),
is paused past its session timeout (a zombie), or never comes back. In every case
the final aggregates equal ``evaluator replay`` on the same events exactly:
requests, every nDCG and rate, cohorts, the late count and coverage.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.eventgen import EventSet
from tests.live import (
    KafkaBroker,
    LiveEnv,
    RedisServer,
    new_env,
    produce_paced,
    stop,
    stream,
    wait_until,
)
from tests.test_live_kafka import dataset as live_dataset
from tests.test_live_kafka import finish

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("kafka_client")]
"""Each test runs once per Kafka client (tests/conftest.py)."""

RATE = 2_000.0
"""Events per second produced while the instances consume."""
DEFAULTS: dict[str, str | None] = {
    "EVALUATOR_EVENT_TIME__IDLE_TIMEOUT": None,  # 30s
    "EVALUATOR_KAFKA__SESSION_TIMEOUT": None,  # 45s
}
SHORT_IDLE: dict[str, str | None] = {
    "EVALUATOR_EVENT_TIME__IDLE_TIMEOUT": "2s",
    "EVALUATOR_KAFKA__SESSION_TIMEOUT": "10s",
}


def dataset(seed: int, env: LiveEnv) -> tuple[EventSet, list[dict[str, Any]]]:
    """About 8,000 events of 300 users, and the late interactions held back."""
    return live_dataset(seed, env.settings(), requests=3_000, users=300)


def ordered(events: EventSet, seed: int) -> list[tuple[str, dict[str, Any]]]:
    return stream(
        [("impressions", e) for e in events.impressions]
        + [("interactions", e) for e in events.interactions],
        seed,
    )


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every evaluator a test starts (stopped at teardown, whatever happened)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    stop(procs)


def owns_partitions(log: Path) -> bool:
    return log.exists() and "epoch" in log.read_text(errors="replace")


def two_instances(
    env: LiveEnv, tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    """Two evaluators in one group, once both own partitions."""
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [env.start(logs[0]), env.start(logs[1])]
    started += procs
    wait_until(lambda: all(map(owns_partitions, logs)), 90, "both instances own partitions", procs)
    return procs, logs


def kill_one_mid_stream(
    env: LiveEnv, procs: list[subprocess.Popen[bytes]], stream_: list[tuple[str, dict[str, Any]]]
) -> threading.Thread:
    """Produce at RATE and SIGKILL the first instance 3 s into the stream (by design,
    a timed fault); returns the producing thread."""
    producer = produce_paced(env, stream_, RATE)
    time.sleep(3.0)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    return producer


@pytest.mark.parametrize("timeouts", [DEFAULTS, SHORT_IDLE], ids=["defaults", "short-idle"])
def test_sigkill_with_a_backlog_and_restart_is_exact(
    kafka_bootstrap, redis_url, tmp_path, started, timeouts
) -> None:
    env = new_env(kafka_bootstrap, redis_url, partitions=3, overrides=timeouts)
    events, late = dataset(61, env)
    procs, _ = two_instances(env, tmp_path, started)
    producer = kill_one_mid_stream(env, procs, ordered(events, 61))
    procs[0] = env.start(tmp_path / "a2.log")  # restarted at once
    started.append(procs[0])
    producer.join()
    finish(env, events, late, procs, tmp_path, timeout=240)


def test_sigkill_without_restart_the_survivor_takes_over(
    kafka_bootstrap, redis_url, tmp_path, started
) -> None:
    env = new_env(kafka_bootstrap, redis_url, partitions=3, overrides=SHORT_IDLE)
    events, late = dataset(62, env)
    procs, logs = two_instances(env, tmp_path, started)
    kill_one_mid_stream(env, procs, ordered(events, 62)).join()
    finish(env, events, late, [procs[1]], tmp_path, timeout=240)
    assert "partition" in logs[1].read_text()


def test_a_zombie_owner_is_fenced(kafka_bootstrap, redis_url, tmp_path, started) -> None:
    """SIGSTOP one instance past its session timeout while it holds a backlog: the group
    moves its partitions to the other, which claims them. On SIGCONT the zombie's
    writes are refused (it drops those partitions) and the results stay exact."""
    env = new_env(kafka_bootstrap, redis_url, partitions=3, overrides=SHORT_IDLE)
    events, late = dataset(63, env)
    procs, logs = two_instances(env, tmp_path, started)
    producer = produce_paced(env, ordered(events, 63), RATE)
    time.sleep(2.0)  # the pause lands mid-stream, by design
    procs[0].send_signal(signal.SIGSTOP)
    # the other instance takes the zombie's partitions once its session has expired
    claims = logs[1].read_text(errors="replace").count("epoch")
    wait_until(
        lambda: logs[1].read_text(errors="replace").count("epoch") > claims,
        60,
        "the survivor has claimed the paused instance's partitions",
        [procs[1]],
    )
    producer.join()
    procs[0].send_signal(signal.SIGCONT)
    finish(env, events, late, procs, tmp_path, timeout=240)


def test_redis_restarted_having_lost_its_last_writes(kafka_bootstrap, tmp_path, started) -> None:
    """Redis SIGKILLed mid-stream and restarted from an AOF that lacks its last ~1.5 s of
    writes (what ``appendfsync everysec`` may lose to a machine crash), state and offsets
    together. The owners notice (their next checkpoint does not follow what Redis
    holds, or fails), reload their partitions and consume again from the offsets Redis
    kept. Exact."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        env = new_env(kafka_bootstrap, server.url, partitions=3, overrides=SHORT_IDLE)
        events, late = dataset(64, env)
        procs, logs = two_instances(env, tmp_path, started)
        producer = produce_paced(env, ordered(events, 64), RATE)
        time.sleep(1.5)  # mid-stream, by design
        earlier = server.snapshot()
        time.sleep(1.5)  # the writes Redis will lose
        server.kill()
        server.restore(earlier)
        server.start()
        producer.join()
        finish(env, events, late, procs, tmp_path, timeout=240)
        reloads = sum(log.read_text(errors="replace").count("reload") for log in logs)
        assert reloads > 0  # the lost writes were noticed
    finally:
        server.kill()


def test_broker_restarted_mid_stream(redis_url, tmp_path, started) -> None:
    """The broker is killed mid-stream and started again (same data): the evaluators
    retry, the producer's unsent events follow once it is back. Exact."""
    broker = KafkaBroker(tmp_path / "kafka")
    broker.start()
    try:
        # the default timeouts: the idle timeout (30 s) must outlast the producer's pause
        # across the restart; a partition whose owner sits at the end offset that long
        # is idle by definition, finalises by the wall clock, and the events after the
        # pause are rightly late (with 2 s, a slow producer made a quarter of them late)
        env = new_env(broker.bootstrap, redis_url, partitions=3, overrides=DEFAULTS)
        events, late = dataset(65, env)
        procs, _ = two_instances(env, tmp_path, started)
        half = len(ordered(events, 65)) // 2
        stream_ = ordered(events, 65)
        produce_paced(env, stream_[:half], RATE).join()
        broker.kill()  # mid-stream: half of the events are consumed or in the log
        broker.start()
        produce_paced(env, stream_[half:], RATE).join()
        finish(env, events, late, procs, tmp_path, timeout=240)
    finally:
        broker.kill()


def test_producers_that_do_not_key_by_user_are_exact(
    kafka_bootstrap, redis_url, tmp_path, started
) -> None:
    """Events produced without keys land on any partition: each is forwarded, keyed by
    user, through the repartition topic to its user's partition, and partitions wait
    for each other while forwarding goes on. Exact, only slower."""
    env = new_env(kafka_bootstrap, redis_url, partitions=3, overrides=SHORT_IDLE)
    events, late = dataset(66, env)
    procs, _ = two_instances(env, tmp_path, started)
    produce_paced(env, ordered(events, 66), RATE, keyed=False).join()
    finish(env, events, late, procs, tmp_path, timeout=240)
