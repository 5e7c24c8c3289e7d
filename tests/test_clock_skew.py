"""A producer with a wrong clock: events stamped after the consuming clock + max_future
are invalid (``future_timestamp``) and move nothing, through the partition tasks."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from evaluator.adapters.memory import MemoryStore
from evaluator.config import Settings, load_settings
from evaluator.config.plain import tasks_config
from evaluator.engine.batches import PartitionBatch, Rejected
from evaluator.engine.tasks import Tasks
from tests.eventgen import EventSet, generate
from tests.live import (
    LiveEnv,
    dead_letters,
    free_port,
    new_env,
    produce_paced,
    stop,
    wait_until,
)
from tests.livecheck import SENTINEL_VARIANT, FakeClock, partition_of

DAY = 86_400_000
Bad = list[tuple[str, dict[str, Any]]]
"""Events of a bad clock, by kind."""


def users_by_partition(partitions: int, prefix: str) -> list[str]:
    """A user id of each partition (as a producer keyed by user places it)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        found.setdefault(partition_of(f"{prefix}-{n}", partitions), f"{prefix}-{n}")
        n += 1
    return [found[p] for p in range(partitions)]


def bad_pairs(
    partitions: int, at_ms: int, prefix: str = "fast", variant: str = "A"
) -> list[tuple[str, dict[str, Any]]]:
    """One impression and one interaction naming it on each partition, stamped ``at_ms``."""
    out: list[tuple[str, dict[str, Any]]] = []
    for user in users_by_partition(partitions, prefix):
        rid = f"{user}-r"
        out.append(
            (
                "impressions",
                {
                    "event_id": f"{rid}-i",
                    "request_id": rid,
                    "user_id": user,
                    "variant": variant,
                    "timestamp": at_ms,
                    "items": ["p1", "p2", "p3"],
                },
            )
        )
        out.append(
            (
                "interactions",
                {
                    "event_id": f"{rid}-x",
                    "request_id": rid,
                    "user_id": user,
                    "item_id": "p3",
                    "type": "purchase",
                    "timestamp": at_ms + 1_000,
                },
            )
        )
    return out


def run(
    settings: Settings,
    events: EventSet,
    partitions: int,
    bad: Bad | Callable[[int], Bad],
) -> tuple[MemoryStore, Tasks, list[Rejected]]:
    """Deliver the events in event-time order (a little jitter), the clock a second after
    each batch's newest event as when consuming live traffic; ``bad`` (or what it returns
    for the clock then) arrives on its own mid-stream (the other batches are the same
    with or without it)."""
    store = MemoryStore(settings.layout(partitions))
    clock = FakeClock()
    tasks = Tasks(store, tasks_config(settings, partitions), clock_ms=clock)
    tasks.assign(range(partitions))
    rng = random.Random(5)
    stream = [("impressions", e) for e in events.impressions]
    stream += [("interactions", e) for e in events.interactions]
    stream.sort(key=lambda ke: ke[1]["timestamp"] + rng.randrange(0, 3_000))
    chunks = [stream[i : i + 64] for i in range(0, len(stream), 64)]
    middle = len(chunks) // 2
    plan: list[Bad | None] = [*chunks[:middle], None, *chunks[middle:]] if bad else chunks
    offsets: dict[str, int] = defaultdict(int)
    letters: list[Rejected] = []
    for planned in plan:
        if planned is None:
            chunk = bad(clock.now) if callable(bad) else bad
        else:
            chunk = planned
            clock.now = max(e["timestamp"] for _, e in chunk) + 1_000
        parts: dict[str, list[bytes]] = defaultdict(list)
        for kind, e in chunk:
            parts[f"{kind}:{partition_of(e['user_id'], partitions)}"].append(json.dumps(e).encode())
        batches = []
        for name, payloads in parts.items():
            first = offsets[name]
            offsets[name] += len(payloads)
            kind = name.split(":")[0]
            offs = range(first, first + len(payloads))
            batches.append(PartitionBatch(kind, name, payloads, offs))  # type: ignore[arg-type]
        tasks.apply(batches, {}, dead_letter=letters.extend)
    # the stream goes quiet a day later: every input idle, every request final
    clock.now += DAY
    names = [f"{k}:{p}" for k in ("impressions", "interactions") for p in range(partitions)]
    tasks.apply([], dict.fromkeys(names, clock.now))
    clock.now += tasks.config.idle_timeout_ms
    tasks.apply([], dict.fromkeys(names, clock.now))
    tasks.settle()
    return store, tasks, letters


def assert_same_aggregates(a: MemoryStore, b: MemoryStore, settings: Settings) -> None:
    for window in settings.layout().windows_ms:
        got, want = a.blocks(window), b.blocks(window)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-12)
    assert a.counters() == b.counters()


@pytest.mark.parametrize("partitions", [3, 1])
def test_a_producer_two_days_fast_changes_nothing(partitions: int) -> None:
    settings = load_settings(environ={})  # the defaults: max_future 1m
    events = generate(8, requests=600, users=40)
    middle = sorted(e["timestamp"] for e in events.impressions)[len(events.impressions) // 2]
    bad = bad_pairs(partitions, middle + 2 * DAY)
    clean, clean_tasks, _ = run(settings, events, partitions, [])
    dirty, dirty_tasks, letters = run(settings, events, partitions, bad)
    assert_same_aggregates(dirty, clean, settings)
    assert dirty_tasks.stats.late == clean_tasks.stats.late
    assert dirty_tasks.stats.invalid == {"future_timestamp": 2 * partitions}
    assert sorted(json.loads(r.payload)["event_id"] for r in letters) == sorted(
        e["event_id"] for _, e in bad
    )
    assert {r.event.reason.value for r in letters} == {"future_timestamp"}


def test_without_the_check_one_pair_finalises_everything_early() -> None:
    """What the check prevents (``max_future = 0``): the pair moves event time two days,
    every open request is finalised before its interactions arrive."""
    settings = load_settings(environ={}, overrides={"event_time": {"max_future": 0}})
    events = generate(8, requests=600, users=40)
    middle = sorted(e["timestamp"] for e in events.impressions)[len(events.impressions) // 2]
    _, clean_tasks, _ = run(settings, events, 1, [])
    _, dirty_tasks, letters = run(settings, events, 1, bad_pairs(1, middle + 2 * DAY))
    assert letters == []
    assert dirty_tasks.stats.late > clean_tasks.stats.late + 50


def requests_in(store: MemoryStore, settings: Settings) -> float:
    longest = max(settings.layout().windows_ms)
    return sum(float(b[..., 0].sum()) for b in store.blocks(longest).values())


def test_an_event_within_max_future_is_applied() -> None:
    """Seconds of skew (an NTP-synced producer) are normal: a pair 30 s ahead of the
    clock counts."""
    settings = load_settings(environ={})
    events = generate(8, requests=600, users=40)
    stamps: list[int] = []

    def ahead(now: int) -> Bad:
        stamps.append(now)
        return bad_pairs(1, now + 30_000)

    store, tasks, letters = run(settings, events, 1, ahead)
    clean, _, _ = run(settings, events, 1, [])
    assert stamps and letters == [] and tasks.stats.invalid == {}
    assert requests_in(store, settings) == requests_in(clean, settings) + 1


def test_max_future_is_inclusive_to_the_millisecond() -> None:
    settings = load_settings(environ={})  # max_future 1m
    events = generate(8, requests=600, users=40)

    def edge(now: int) -> Bad:
        imp, _ = bad_pairs(1, now + 60_000)
        late, _ = bad_pairs(1, now + 60_001, prefix="later")
        return [imp, late]

    store, tasks, letters = run(settings, events, 1, edge)
    clean, _, _ = run(settings, events, 1, [])
    assert [json.loads(r.payload)["user_id"] for r in letters] == ["later-0"]
    assert tasks.stats.invalid == {"future_timestamp": 1}
    assert requests_in(store, settings) == requests_in(clean, settings) + 1


# --- live: `evaluator run` against the real broker and Redis, default settings ------------

HOUR = 3_600_000
LIVE_DEFAULTS: dict[str, str | None] = {
    "EVALUATOR_EVENT_TIME__IDLE_TIMEOUT": None,
    "EVALUATOR_KAFKA__MAX_POLL_RECORDS": None,
    "EVALUATOR_KAFKA__POLL_TIMEOUT": None,
    "EVALUATOR_PROPENSITY__ESTIMATOR": None,
}
"""The test environment's settings put back to their defaults (the readout is still
refreshed every second, so the test reads it promptly)."""
LIVE_REQUESTS = 4_000
KINDS = ("impressions", "interactions")


def recent_events(
    seed: int, partitions: int
) -> tuple[EventSet, list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """4,000 requests ending 7 h before now; the interactions naming a request after
    its deadline, held back to be sent once it is final (whether one in the stream is
    late depends on the poll it arrives in; only those of the requests due after the
    data's end are kept: the closing events' time expires the other requests' markers,
    and an interaction without one is dropped uncounted); a closing impression and
    interaction on each partition 6 h after the data (the closing variant is not
    compared: its requests close only by idleness)."""
    events = generate(seed, requests=LIVE_REQUESTS, users=300, catalog=3_000)
    last = max(e["timestamp"] for e in events.impressions + events.interactions)
    shift = time.time_ns() // 1_000_000 - 7 * HOUR - last
    for e in events.impressions + events.interactions:
        e["timestamp"] += shift
    deadline = load_settings(environ={}).finalise_config().deadline
    shown = {e["request_id"]: e["timestamp"] for e in events.impressions}
    late = [
        it
        for it in events.interactions
        if "request_id" in it and it["timestamp"] > deadline(shown[it["request_id"]])
    ]
    held = {id(it) for it in late}
    events.interactions = [it for it in events.interactions if id(it) not in held]
    data_end = max(shown.values())  # the last impression
    late = [it for it in late if deadline(shown[it["request_id"]]) > data_end + 60_000]
    closing = bad_pairs(partitions, data_end + 6 * HOUR, "closing", SENTINEL_VARIANT)
    return events, late, closing


def ordered(events: EventSet, seed: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    stream = [("impressions", e) for e in events.impressions]
    stream += [("interactions", e) for e in events.interactions]
    stream.sort(key=lambda ke: ke[1]["timestamp"] + rng.randrange(0, 3_000))
    return stream


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def readout_24h(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict:
    """Requests and every nDCG per variant in the 24 h window, as exported."""
    return {
        (name, labels): value
        for (name, labels), value in metrics.items()
        if name in ("recsys_eval_requests", "recsys_eval_ndcg")
        and ("window", "24h") in labels
        and ("variant", SENTINEL_VARIANT) not in labels
    }


def requests_24h(metrics: dict) -> float:
    return sum(
        v
        for (name, labels), v in readout_24h(metrics).items()
        if name == "recsys_eval_requests" and ("cohort", "all") in labels
    )


def forget(env: LiveEnv) -> None:
    """Delete the run's keys: its data is recent, so its window blocks would live for
    their TTL (the 5 m window alone keeps ~220 MB of 25 s buckets per run for an hour)."""
    client = redis.Redis.from_url(env.redis_url)
    try:
        names = list(client.scan_iter(match=f"{{{env.name}:*", count=10_000))
        for start in range(0, len(names), 1_000):
            client.unlink(*names[start : start + 1_000])
    finally:
        client.close()


def live_run(
    env: LiveEnv, stream: list[tuple[str, dict[str, Any]]], log: Path
) -> tuple[subprocess.Popen[bytes], int, threading.Thread]:
    """`evaluator run` consuming while the stream is produced in small batches."""
    port = free_port()
    proc = env.start(log, http_port=port)
    return proc, port, produce_paced(env, stream, rate=4_000.0)


def settled(
    env: LiveEnv, proc, port: int, produced: dict[str, int], late: list[dict[str, Any]]
) -> dict:
    """The exported metrics once every event is consumed and the 24 h readout shows
    every request, then ``late`` sent and counted."""
    store = env.store()
    state: dict = {}

    def done() -> bool:
        try:
            metrics = scrape(port)
        except OSError:  # not serving yet (it starts while the stream is produced)
            return False
        consumed = {
            dict(labels)["topic"]: v
            for (name, labels), v in metrics.items()
            if name == "recsys_eval_events_consumed_total"
        }
        state["metrics"] = metrics
        return (
            all(consumed.get(k, 0) >= n for k, n in produced.items())
            and store.counters().get("finalised", 0) >= LIVE_REQUESTS
            and requests_24h(metrics) == LIVE_REQUESTS
        )

    try:
        wait_until(done, 180, f"the 24 h readout shows {LIVE_REQUESTS} requests", [proc])
        env.produce("interactions", [(it["user_id"], json.dumps(it).encode()) for it in late])
        distinct = len({it["event_id"] for it in late})
        wait_until(
            lambda: store.counters().get("late", 0) >= distinct,
            60,
            f"{distinct} late interactions are counted",
            [proc],
        )
        wait_until(
            lambda: scrape(port).get(("recsys_eval_late_events_total", ())) == distinct,
            30,
            "/metrics shows them",
            [proc],
        )
        state["metrics"] = scrape(port)
        state["late"] = store.counters()["late"]
        state["letters"] = dead_letters(env)
    finally:
        store.close()
    return state


@pytest.mark.services
@pytest.mark.parametrize(
    ("partitions", "ahead_ms"),
    [(3, 2 * 86_400_000), (1, 2 * 86_400_000), (3, 10 * 60_000)],
    ids=["3-partitions-2-days", "1-partition-2-days", "3-partitions-10-minutes"],
)
@pytest.mark.usefixtures("kafka_client")
def test_live_readout_ignores_a_producer_with_a_wrong_clock(
    kafka_bootstrap, redis_url, tmp_path, partitions: int, ahead_ms: int
) -> None:
    """The issue's scenario, run clean and with a bad-clock pair on every partition, at
    the defaults (``event_time.max_future = 1m``): two days ahead of the data, or ten
    minutes ahead of the true time (a plausible skew, also past the default). Either
    way the pairs are invalid (``future_timestamp``), dead-lettered once each, and the
    24 h readout and the late count equal the clean run's."""
    events, late, closing = recent_events(41, partitions)
    assert late, "the data must hold interactions for final requests"
    stream = ordered(events, 41)
    if ahead_ms >= 86_400_000:  # ahead of the rest of the data
        middle = stream[len(stream) // 2][1]["timestamp"]
        bad = bad_pairs(partitions, middle + ahead_ms)
    else:  # ahead of the true time when it is produced
        bad = bad_pairs(partitions, time.time_ns() // 1_000_000 + ahead_ms)
    half = len(stream) // 2
    dirty_stream = [*stream[:half], *bad, *stream[half:], *closing]
    clean_stream = [*stream, *closing]
    runs = {}
    envs = {
        name: new_env(kafka_bootstrap, redis_url, partitions=partitions, overrides=LIVE_DEFAULTS)
        for name in ("clean", "dirty")
    }
    procs = {}
    try:
        for name, s in (("clean", clean_stream), ("dirty", dirty_stream)):
            procs[name] = live_run(envs[name], s, tmp_path / f"{name}.log")
        for name, s in (("clean", clean_stream), ("dirty", dirty_stream)):
            proc, port, producer = procs[name]
            producer.join(timeout=120)
            produced = {k: sum(1 for kind, _ in s if kind == k) for k in KINDS}
            runs[name] = settled(envs[name], proc, port, produced, late)
    finally:
        stop([p for p, _, _ in procs.values()])
        for env in envs.values():
            forget(env)
    clean, dirty = runs["clean"], runs["dirty"]
    want, got = readout_24h(clean["metrics"]), readout_24h(dirty["metrics"])
    assert got.keys() == want.keys() and len(want) > 20
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert dirty["late"] == clean["late"] == len({it["event_id"] for it in late})
    invalid = ("recsys_eval_invalid_events_total", (("reason", "future_timestamp"),))
    assert clean["metrics"][invalid] == 0
    assert dirty["metrics"][invalid] == 2 * partitions
    assert clean["letters"] == []
    letters = sorted(
        (topic.rsplit("-", 1)[1], h["reason"].decode(), json.loads(value)["event_id"])
        for topic, h, value in dirty["letters"]
    )
    assert letters == sorted(
        (f"{kind}.dlq", "future_timestamp", e["event_id"]) for kind, e in bad
    )  # each bad event once, nothing else
