"""End to end against the real Kafka broker and the real Redis server.

The evaluator runs as a separate process (`python -m evaluator run`), exactly as
a user runs it. Its Redis aggregates must equal `evaluator replay` on the same
events; interactions that arrive after their request was finalised are counted
as late instead of applied.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from tests.eventgen import EventSet, generate
from tests.live import (
    ROOT,
    dead_letters,
    free_port,
    has_sample,
    new_env,
    stop,
    stream,
    to_payloads,
    wait_until,
)
from tests.livecheck import SENTINEL_VARIANT, compare_with_replay

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("kafka_client")]
"""Each test runs once per Kafka client (tests/conftest.py; the sources' own contract:
tests/test_source_contract.py)."""

HUGE = b"{" + b"x" * 1_200_000
"""Undecodable, and larger than a producer or broker takes by default: its dead
letter is cut to fit (else every send fails and the partition stalls)."""

BAD_IMPRESSIONS = [
    b"{not json",
    HUGE,
    b'{"event_id": "x1", "items": []}',
    json.dumps(
        {
            "event_id": "x2",
            "request_id": "x2",
            "user_id": "u",
            "variant": "A",
            "timestamp": 1,
            "items": ["a", "a"],
        }
    ).encode(),
]
BAD_INTERACTIONS = [
    json.dumps(
        {"event_id": "y1", "user_id": "u", "item_id": "a", "type": "teleport", "timestamp": 1}
    ).encode()
]


def dataset(
    seed: int, settings, requests: int = 400, users: int = 25
) -> tuple[EventSet, list[dict[str, Any]]]:
    """Generated events (out of order, duplicated, user joins), and the request-id
    interactions later than their request's deadline, held back to send late. Once the
    topics are consumed, every partition goes idle and finalises by the wall clock
    (years after the events)."""
    events = generate(seed, requests=requests, users=users, catalog=3_000)  # coverage unsaturated
    shown = {e["request_id"]: e["timestamp"] for e in events.impressions}
    config = settings.finalise_config()
    late = [
        it
        for it in events.interactions
        if "request_id" in it and it["timestamp"] > config.deadline(shown[it["request_id"]])
    ]
    late_ids = {id(it) for it in late}
    events.interactions = [it for it in events.interactions if id(it) not in late_ids]
    return events, late


def expected_requests(events: EventSet) -> int:
    return len({e["request_id"] for e in events.impressions if e["variant"] != SENTINEL_VARIANT})


def produce_events(env, events: EventSet, seed: int, invalid: bool = True) -> None:
    ordered = stream(
        [("impressions", e) for e in events.impressions]
        + [("interactions", e) for e in events.interactions],
        seed,
    )
    imps = to_payloads(ordered, "impressions")
    ints = to_payloads(ordered, "interactions")
    if invalid:
        imps += [("bad", p) for p in BAD_IMPRESSIONS]
        ints += [("bad", p) for p in BAD_INTERACTIONS]
    env.produce("impressions", imps)
    env.produce("interactions", ints)


def finish(
    env,
    events: EventSet,
    late: list[dict[str, Any]],
    procs,
    tmp_path,
    *,
    before_stop=None,
    timeout: float = 120,
) -> None:
    """Wait for every request to finalise, send the late events, compare with replay
    (the evaluators are stopped whatever happens)."""
    store = env.store()
    try:
        want = expected_requests(events)
        wait_until(
            lambda: store.counters().get("finalised", 0) >= want,
            timeout,
            f"{want} requests are finalised",
            procs,
        )
        env.produce("interactions", [(it["user_id"], json.dumps(it).encode()) for it in late])
        distinct_late = len({it["event_id"] for it in late})
        wait_until(
            lambda: store.counters().get("late", 0) >= distinct_late,
            60,
            f"{distinct_late} late interactions are counted",
            procs,
        )
        if before_stop is not None:
            before_stop()
    finally:
        stop(procs)
    assert store.counters()["finalised"] == want
    assert store.counters()["late"] == distinct_late
    # the only allowed difference: late interactions are counted, not applied, so the
    # aggregates must equal replay of the events without them
    compare_with_replay(store, events, env.settings(), tmp_path)
    store.close()


def test_live_run_equals_replay_and_dead_letters_bad_events(
    kafka_bootstrap, redis_url, tmp_path
) -> None:
    env = new_env(kafka_bootstrap, redis_url)
    events, late = dataset(31, env.settings())
    assert late, "the data set must contain late interactions"
    produce_events(env, events, 31)
    port = free_port()
    proc = env.start(tmp_path / "run.log", http_port=port)

    def scrape() -> None:
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/readyz") as reply:
            assert reply.status == 200

        def metrics() -> str:
            with urllib.request.urlopen(base + "/metrics") as reply:
                return reply.read().decode()

        # window metrics are refreshed in the background (every second in these tests)
        wait_until(lambda: 'window="24h"' in metrics(), 30, "/metrics shows the windows", [proc])
        text = metrics()
        assert "recsys_eval_ndcg{" in text
        assert "recsys_eval_users{" in text
        assert "recsys_eval_invalid_events_total" in text

    finish(env, events, late, [proc], tmp_path, before_stop=scrape)
    letters = dead_letters(env)
    reasons = sorted(h["reason"].decode() for _, h, _ in letters)
    assert reasons == sorted(
        [
            "undecodable",
            "undecodable",
            "missing_field",
            "duplicate_item",
            "unknown_interaction_type",
        ]
    )
    assert all(h["source"].startswith(f"{env.name}-".encode()) for _, h, _ in letters)
    assert [h["truncated_from"] for _, h, _ in letters if "truncated_from" in h] == [
        str(len(HUGE)).encode()
    ]


def test_two_instances_give_the_same_aggregates(kafka_bootstrap, redis_url, tmp_path) -> None:
    env = new_env(kafka_bootstrap, redis_url)
    events, late = dataset(32, env.settings())
    procs = [env.start(tmp_path / "a.log"), env.start(tmp_path / "b.log")]
    produce_events(env, events, 32, invalid=False)
    finish(env, events, late, procs, tmp_path)


def test_two_instances_on_redis_cluster(kafka_bootstrap, redis_cluster_url, tmp_path) -> None:
    """The same on a Redis Cluster: scripts and multi-key reads routed by hash tag."""
    env = new_env(kafka_bootstrap, redis_cluster_url, cluster=True)
    events, late = dataset(35, env.settings())
    procs = [env.start(tmp_path / "a.log"), env.start(tmp_path / "b.log")]
    produce_events(env, events, 35, invalid=False)
    finish(env, events, late, procs, tmp_path)


def test_sigkill_mid_stream_loses_and_doubles_nothing(kafka_bootstrap, redis_url, tmp_path) -> None:
    """Half the stream, SIGKILL, the other half to a new instance. The idle timeout is
    longer than the kill takes: the first instance must not finalise the first half
    by idleness before the second half exists (it would rightly count the second
    half's interactions with those requests as late: the race that made this test
    flaky)."""
    env = new_env(
        kafka_bootstrap, redis_url, overrides={"EVALUATOR_EVENT_TIME__IDLE_TIMEOUT": "15s"}
    )
    events, late = dataset(33, env.settings())
    cut = sorted(e["timestamp"] for e in events.impressions)[len(events.impressions) // 2]
    first_half = EventSet(
        [e for e in events.impressions if e["timestamp"] < cut],
        [e for e in events.interactions if e["timestamp"] < cut],
    )
    second_half = EventSet(
        [e for e in events.impressions if e["timestamp"] >= cut],
        [e for e in events.interactions if e["timestamp"] >= cut],
    )
    produce_events(env, first_half, 33, invalid=False)
    store = env.store()
    first = env.start(tmp_path / "first.log")
    wait_until(
        lambda: store.counters().get("finalised", 0) > 20,
        120,
        "the first instance has finalised some requests",
        [first],
    )
    first.send_signal(signal.SIGKILL)  # mid-stream: half the events are not even produced yet
    first.wait()
    produce_events(env, second_half, 34, invalid=False)
    second = env.start(tmp_path / "second.log")
    finish(env, events, late, [second], tmp_path)


def test_demo_through_kafka_and_redis(kafka_bootstrap, redis_url, tmp_path) -> None:
    """`evaluator demo --kafka --redis`: the simulator produces to Kafka and the run loop
    consumes into Redis; the page's numbers come from the real services."""
    env = new_env(kafka_bootstrap, redis_url)
    port = free_port()
    log = tmp_path / "demo.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "evaluator", "demo", "--kafka", "--redis", "--port", str(port)],
        env={**os.environ, **env.environ, "EVALUATOR_HTTP__PORT": str(port)},
        stdout=open(log, "ab"),  # noqa: SIM115 - owned by the child process
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    seen: list[str] = []

    def has_numbers() -> bool:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
            seen.append(text.read().decode())
        except OSError:
            return False
        return has_sample(seen[-1], "recsys_eval_ndcg", variant="treatment")

    try:
        wait_until(has_numbers, 90, "the Kafka demo shows live numbers", [proc])
        assert has_sample(seen[-1], "recsys_eval_events_consumed_total", topic="impressions")
        store = env.store()
        assert store.counters().get("finalised", 0) > 0  # the state is in Redis
        store.close()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def test_a_valid_event_larger_than_the_defaults_is_forwarded(
    kafka_bootstrap, redis_url, tmp_path
) -> None:
    """An impression of 1.2 MB (valid: a long attribute the evaluator does not use) on
    the wrong partition for its user is forwarded like any other: the repartition topic
    is created to take what the input topics take. Before, its forward failed on every
    retry (over the producer's and the broker's 1 MiB) and its partition stalled."""
    from kafka import KafkaProducer

    from evaluator.engine.partitioner import murmur2_partitions

    env = new_env(kafka_bootstrap, redis_url)
    events, late = dataset(37, env.settings(), requests=120, users=12)
    big = events.impressions[0]
    big["item_attributes"] = {
        **(big.get("item_attributes") or {}),
        "blurb": ["x" * (1_200_000 // len(big["items"]))] * len(big["items"]),
    }
    payload = json.dumps(big).encode()
    assert len(payload) > 1_200_000
    events.impressions.remove(big)
    produce_events(env, events, 37, invalid=False)
    events.impressions.append(big)
    (home,) = murmur2_partitions([big["user_id"].encode()], env.partitions)
    producer = KafkaProducer(bootstrap_servers=env.bootstrap, max_request_size=2_000_000)
    producer.send(
        f"{env.name}-impressions", value=payload, partition=(home + 1) % env.partitions
    ).get(timeout=30)
    producer.close()
    proc = env.start(tmp_path / "run.log")
    finish(env, events, late, [proc], tmp_path)


def test_a_forward_refused_as_too_large_is_dead_lettered(
    kafka_bootstrap, redis_url, tmp_path
) -> None:
    """A valid impression compressed by its producer (2.5 MB of JSON in a 2 MB input
    topic) on the wrong partition: uncompressed, it is over what the repartition topic
    and the producer take. It is dead-lettered as ``too_large_to_forward`` and the run
    goes on exact for everything else (before, its forward failed on every retry and the
    partition stalled)."""
    from kafka import KafkaProducer

    from evaluator.engine.partitioner import murmur2_partitions

    env = new_env(kafka_bootstrap, redis_url)
    events, late = dataset(38, env.settings(), requests=120, users=12)
    produce_events(env, events, 38, invalid=False)
    big = {**events.impressions[0], "request_id": "huge", "event_id": "huge"}
    big["item_attributes"] = {"blurb": ["y" * (2_500_000 // len(big["items"]))] * len(big["items"])}
    (home,) = murmur2_partitions([big["user_id"].encode()], env.partitions)
    producer = KafkaProducer(
        bootstrap_servers=env.bootstrap, compression_type="gzip", max_request_size=3_000_000
    )
    producer.send(
        f"{env.name}-impressions",
        value=json.dumps(big).encode(),
        partition=(home + 1) % env.partitions,
    ).get(timeout=30)
    producer.close()
    proc = env.start(tmp_path / "run.log")
    finish(env, events, late, [proc], tmp_path)
    letters = dead_letters(env)
    assert [h["reason"] for _, h, _ in letters] == [b"too_large_to_forward"]
    assert letters[0][1]["source"].startswith(f"{env.name}-impressions/".encode())
