"""CPU per event of one `evaluator run` keeping up with live traffic, not a backlog.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_steady.py [--rate 3000] [--seconds 40] [--repeats 3]
        [--client kafka-python|confluent] [--idle-after 35]

``bench_run.py`` measures a backlog: each poll brings thousands of events, so the
costs paid once per batch (a chunk of columns, its indexes, a finalisation, a
checkpoint) are spread over many. A deployment that keeps up with its producers
polls what arrived since the last poll: at a few thousand events/s, tens of events
a partition. This benchmark starts the evaluator on empty topics (4 partitions),
produces the events of ``bench_run.py`` in event-time order at ``--rate`` events/s
of wall time, and reports the evaluator's CPU per event from the first event to the
last committed offset, beside its CPU per second when idle (over 10 s before the
traffic starts; with ``--idle-after 35``, once every partition is idle, past
``event_time.idle_timeout``) and Redis's CPU per event. Settings under test come from the
environment (``EVALUATOR_KAFKA__FETCH_MIN_BYTES=1`` ...), as in ``bench_run.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import redis
from _common import machine
from bench_run import (
    committed,
    drop_prefix,
    evaluator_env,
    events,
    process_cpu_s,
    redis_cpu_s,
    start_evaluator,
)
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

IDLE_S = 10.0
"""Idle CPU is measured over this long, once the evaluator owns its partitions."""


class Steady(NamedTuple):
    cpu_us: float
    """Evaluator CPU µs per event, from the first event produced to the last offset
    committed."""
    redis_cpu_us: float
    idle_cpu: float
    """Evaluator CPU seconds per second while no event arrives."""
    lag_s: float
    """From the last event produced to its offset committed."""


def in_time_order(imps: list[bytes], ints: list[bytes]) -> list[tuple[str, bytes, bytes]]:
    """(kind, key, payload) of every event, in event-time order, as a live site sends them."""
    tagged = [("impressions", p) for p in imps] + [("interactions", p) for p in ints]
    decoded = [(json.loads(p), kind, p) for kind, p in tagged]
    decoded.sort(key=lambda e: e[0]["timestamp"])
    return [(kind, e["user_id"].encode(), p) for e, kind, p in decoded]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def measure(
    bootstrap: str,
    redis_url: str,
    stream: list[tuple[str, bytes, bytes]],
    rate: float,
    log: Path,
    *,
    client_name: str,
    idle_after_s: float = 0.0,
) -> Steady:
    name = f"steady-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(f"{name}-{k}", 4, 1) for k in ("impressions", "interactions")])
    env = {
        **{k: v for k, v in os.environ.items() if k.startswith("EVALUATOR_")},
        "EVALUATOR_PROPENSITY__ESTIMATOR": "none",
        "EVALUATOR_JOIN__ATTRIBUTION_WINDOW": "5m",
        "EVALUATOR_HTTP__PORT": "0",
        **evaluator_env(bootstrap, redis_url, name, name),
        "EVALUATOR_KAFKA__CLIENT": client_name,
    }
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    client = redis.Redis.from_url(redis_url)
    with open(log, "wb") as out:
        proc = start_evaluator(env, out)
    try:
        # owned once it has checkpointed its partitions' claims
        wait_for(lambda: len(client.keys(f"{{{name}:*}}:pm")) == 4, 120, "the assignment")
        time.sleep(idle_after_s)  # past event_time.idle_timeout: every partition idle
        idle_at, idle_t = process_cpu_s(proc.pid), time.perf_counter()
        time.sleep(IDLE_S)  # measuring idle CPU: nothing to wait for
        idle = (process_cpu_s(proc.pid) - idle_at) / (time.perf_counter() - idle_t)
        cpu_at, redis_at = process_cpu_s(proc.pid), redis_cpu_s(client)
        start = time.perf_counter()
        for n, (kind, key, payload) in enumerate(stream):
            producer.send(f"{name}-{kind}", payload, key=key)
            if n % 100 == 99:  # paced in steps of 100 events
                ahead = start + (n + 1) / rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
        producer.flush()
        sent = time.perf_counter()
        wait_for(lambda: committed(admin, f"{name}-eval") >= len(stream), 300, "the commits")
        lag = time.perf_counter() - sent
        cpu = process_cpu_s(proc.pid) - cpu_at
        return Steady(
            cpu / len(stream) * 1e6,
            (redis_cpu_s(client) - redis_at) / len(stream) * 1e6,
            idle,
            lag,
        )
    finally:
        proc.terminate()
        proc.wait()
        producer.close()
        admin.delete_topics([f"{name}-{k}" for k in ("impressions", "interactions")])
        admin.close()
        client.close()
        drop_prefix(redis_url, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=3000.0, help="events/s of wall time")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--client", default="kafka-python", choices=["kafka-python", "confluent"])
    parser.add_argument(
        "--idle-after",
        type=float,
        default=0.0,
        help="seconds after the assignment before idle CPU is measured; past "
        "event_time.idle_timeout (30 s), every partition is idle",
    )
    args = parser.parse_args()
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    redis_url = os.environ["REDIS_URL"]
    imps, ints = events(int(args.rate * args.seconds / 2))
    stream = in_time_order(imps, ints)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            log = Path(tmp) / f"{i}.log"
            got = measure(
                bootstrap,
                redis_url,
                stream,
                args.rate,
                log,
                client_name=args.client,
                idle_after_s=args.idle_after,
            )
            runs.append(got)
            print(
                f"  run {i + 1}: evaluator {got.cpu_us:.1f} CPU µs/event, Redis "
                f"{got.redis_cpu_us:.1f}, idle {got.idle_cpu:.3f} CPU s/s, "
                f"last commit {got.lag_s:.1f} s after the last event"
            )
    print(f"machine: {machine()}")
    print(
        f"{len(stream):,} events at {args.rate:,.0f} events/s, {args.client}, "
        f"medians of {args.repeats}"
    )
    print(
        f"  evaluator {statistics.median(r.cpu_us for r in runs):.1f} CPU µs/event, Redis "
        f"{statistics.median(r.redis_cpu_us for r in runs):.1f}, idle "
        f"{statistics.median(r.idle_cpu for r in runs):.3f} CPU s/s"
    )


if __name__ == "__main__":
    main()
