"""Sustained events/s of one `evaluator run` process beside raw consumption, for each
Kafka client (kafka-python and confluent-kafka) side by side.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_run.py [--requests 60000] [--repeats 3] [--clients ...]

Each repeat produces the same events to fresh topics (4 partitions each), then, per
client (``kafka.client``),
1. times a plain consumer of that client reading every message of both topics
   (no decoding): the ceiling;
2. starts `python -m evaluator run` with that client and times it from its first committed offset
   until every offset is committed (each after its partition's checkpoint, state
   durable in Redis), every partition's checkpointed watermark has reached its
   inputs' event time and the finalised count has settled (each checkpoint
   finalises what its partition's event time made due).
It also reports the CPU time per event of the plain consumer, the evaluator
process and Redis over the same intervals: unlike rates, CPU time barely moves
when the shared machine's neighbours steal time. And Redis memory per open
request: impressions of 20 items are ingested with nothing finalised, and
used_memory grows by that much per request.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO, NamedTuple

import redis
from _common import machine, synthetic_events
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000


def events(requests: int, seed: int = 0, spacing_ms: int = 20) -> tuple[list[bytes], list[bytes]]:
    return synthetic_events(
        requests,
        seed=seed,
        spacing_ms=spacing_ms,
        per_request=(0, 1, 1, 2),
        types=("click", "add_to_cart", "purchase"),
    )


def produce(bootstrap: str, name: str, imps: list[bytes], ints: list[bytes]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(f"{name}-{k}", 4, 1) for k in ("impressions", "interactions")])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256_000, acks=1)
    for topic, payloads in ((f"{name}-impressions", imps), (f"{name}-interactions", ints)):
        for p in payloads:  # keyed by user: both topics co-partitioned, as the evaluator needs
            producer.send(topic, p, key=json.loads(p)["user_id"].encode())
    producer.flush()
    producer.close()


def plain_consumer(bootstrap: str, name: str, group: str) -> KafkaConsumer:
    """A kafka-python consumer of both topics from the start, as the ceiling reads them."""
    return KafkaConsumer(
        f"{name}-impressions",
        f"{name}-interactions",
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=5000,
    )


def raw_rate(bootstrap: str, name: str, total: int, client: str) -> tuple[float, float]:
    """Events/s and CPU µs per event of a plain consumer of ``client`` (this process;
    librdkafka's threads included, since process_time counts every thread)."""
    if client == "confluent":
        return _raw_confluent(bootstrap, name, total)
    consumer = plain_consumer(bootstrap, name, f"{name}-raw")
    seen, start, cpu = 0, None, 0.0
    while seen < total:
        records = consumer.poll(timeout_ms=500, max_records=5000)
        if records and start is None:
            start, cpu = time.perf_counter(), time.process_time()
        seen += sum(len(v) for v in records.values())
    elapsed = time.perf_counter() - (start or time.perf_counter())
    cpu = time.process_time() - cpu
    consumer.close()
    return total / elapsed, cpu / total * 1e6


def _raw_confluent(bootstrap: str, name: str, total: int) -> tuple[float, float]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{name}-raw-confluent",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([f"{name}-impressions", f"{name}-interactions"])
    seen, start, cpu = 0, None, 0.0
    while seen < total:
        messages = consumer.consume(num_messages=5000, timeout=0.5)
        if messages and start is None:
            start, cpu = time.perf_counter(), time.process_time()
        seen += sum(1 for m in messages if m.error() is None)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    cpu = time.process_time() - cpu
    consumer.close()
    return total / elapsed, cpu / total * 1e6


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants, all threads
    (Linux /proc): a helper process of the evaluator would count too."""
    stats: dict[int, list[str]] = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            stats[int(path.parent.name)] = path.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
    tree: set[int] = {pid}
    grown = True
    while grown:  # add children of the processes found so far, until none is new
        found = {p for p, fields in stats.items() if int(fields[1]) in tree} - tree
        tree |= found
        grown = bool(found)
    ticks = sum(int(stats[p][11]) + int(stats[p][12]) for p in tree if p in stats)
    return ticks / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def committed(admin: KafkaAdminClient, group: str) -> int:
    offsets = admin.list_group_offsets(group).get(group, {})
    return sum(meta.offset for meta in offsets.values() if meta.offset > 0)


SHARDS = 4
"""Partitions of the measured topics: one shard (hash tag) each."""
SETTLE_S = 2.0
"""After the last offset commit, the run ends once no request was finalised for this long."""
ESTIMATOR = "none"
"""propensity.estimator of the measured evaluator (``--estimator``)."""
ATTRIBUTION_WINDOW = "30m"
"""join.attribution_window of the measured evaluator (``--attribution-window``)."""


class Measured(NamedTuple):
    rate: float
    """Events/s from the first committed offset until the end."""
    cpu_us: float
    """CPU µs per event of the evaluator (its process and any children) over the same
    interval."""
    redis_cpu_us: float
    """CPU µs per event of the Redis server over the same interval."""


OUT_OF_ORDERNESS_MS = 5_000
"""event_time.max_out_of_orderness of the measured evaluator (its default)."""


def caught_up(client: redis.Redis, name: str) -> bool:
    """Whether every partition has finalised all that the data allows while its inputs
    are busy (the rest waits for them to go idle): its checkpointed watermark has
    reached the smallest, over all partitions, of the inputs' largest event times
    minus the out-of-orderness (partitions are held to that bound while events may
    be forwarded between them)."""
    bounds: list[int] = []
    marks: list[int] = []
    for shard in range(SHARDS):
        raw = client.hgetall(f"{{{name}:{shard}}}:pm")
        meta = {k.decode(): int(v) for k, v in raw.items() if k.startswith((b"t:", b"wm"))}
        times = [v for k, v in meta.items() if k.startswith("t:")]
        if not times or "wm" not in meta:
            return False
        bounds.append(min(times) - OUT_OF_ORDERNESS_MS)
        marks.append(meta["wm"])
    return min(marks) >= min(bounds)


def evaluator_env(bootstrap: str, redis_url: str, topics: str, name: str) -> dict[str, str]:
    """The environment of an evaluator on topics ``topics``-* with group ``name``-eval and
    Redis prefix ``name`` (over this process's own)."""
    return {
        **os.environ,
        "EVALUATOR_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "EVALUATOR_KAFKA__IMPRESSIONS_TOPIC": f"{topics}-impressions",
        "EVALUATOR_KAFKA__INTERACTIONS_TOPIC": f"{topics}-interactions",
        "EVALUATOR_KAFKA__GROUP_ID": f"{name}-eval",
        "EVALUATOR_REDIS__URL": redis_url,
        "EVALUATOR_REDIS__KEY_PREFIX": name,
    }


def start_evaluator(env: dict[str, str], out: IO[bytes]) -> subprocess.Popen[bytes]:
    """``python -m evaluator run`` of this checkout with ``env``, its output to ``out``."""
    return subprocess.Popen(
        [sys.executable, "-m", "evaluator", "run"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )


def evaluator_rate(
    bootstrap: str, redis_url: str, name: str, total: int, log: Path, *, client: str
) -> Measured:
    """The evaluator with ``client`` on topics ``name``-*; its group and Redis prefix
    are ``name``-``client``."""
    topics, name = name, f"{name}-{client}"
    env = {
        # settings under test from this environment (EVALUATOR_REGRESSION__PROVISIONAL_AGE=0 ...)
        **{k: v for k, v in os.environ.items() if k.startswith("EVALUATOR_")},
        "EVALUATOR_PROPENSITY__ESTIMATOR": ESTIMATOR,
        "EVALUATOR_JOIN__ATTRIBUTION_WINDOW": ATTRIBUTION_WINDOW,
        "EVALUATOR_HTTP__PORT": "0",  # not measured; and a leftover process cannot block it
        **evaluator_env(bootstrap, redis_url, topics, name),
        "EVALUATOR_KAFKA__CLIENT": client,
    }
    with open(log, "wb") as out:
        proc = start_evaluator(env, out)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    client = redis.Redis.from_url(redis_url)
    counters = [f"{{{name}:{shard}}}:c" for shard in range(SHARDS)]
    start = offsets_at = changed_at = None
    last = -1
    try:
        while True:
            done = committed(admin, f"{name}-eval")
            count = sum(int(client.hget(key, "finalised") or 0) for key in counters)
            now = time.perf_counter()
            if done and start is None:
                start, first = now, done
                cpu_at, redis_at = process_cpu_s(proc.pid), redis_cpu_s(client)
            if done >= total and offsets_at is None:
                offsets_at = now
            if count != last:
                last, changed_at = count, now
            # finalisation runs beside ingestion: the run ends when every offset is
            # committed, every partition has finalised what its data allows and the
            # finalised count has settled (the quiet time not counted)
            if offsets_at is not None and now - changed_at > SETTLE_S and caught_up(client, name):
                events = total - first
                return Measured(
                    events / (max(offsets_at, changed_at) - start),
                    (process_cpu_s(proc.pid) - cpu_at) / events * 1e6,
                    (redis_cpu_s(client) - redis_at) / events * 1e6,
                )
            if proc.poll() is not None:
                raise SystemExit(f"evaluator exited; see {log}")
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait()
        admin.close()
        client.close()


def finalised(redis_url: str, name: str) -> int:
    """Requests finalised (exactly-once counter) under a key prefix."""
    client = redis.Redis.from_url(redis_url)
    total = sum(int(client.hget(f"{{{name}:{s}}}:c", "finalised") or 0) for s in range(SHARDS))
    client.close()
    return total


def drop_prefix(redis_url: str, name: str) -> None:
    """Delete a run's keys (untimed). Left behind, every run's state piles up, and
    Redis's automatic AOF rewrite of it took a whole core during later runs."""
    client = redis.Redis.from_url(redis_url)
    batch: list[bytes] = []
    for key in client.scan_iter(f"{{{name}:*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)
    client.close()


def memory_per_request(bootstrap: str, redis_url: str, requests: int, log: Path) -> float:
    """Redis bytes per open request: impressions only, far from any deadline."""
    client = redis.Redis.from_url(redis_url)
    name = f"bench-mem-{uuid.uuid4().hex[:6]}"
    imps, _ = events(requests, seed=1)
    before = client.info("memory")["used_memory"]
    produce(bootstrap, name, imps, [])
    evaluator_rate(bootstrap, redis_url, name, len(imps), log, client="kafka-python")  # rate unused
    after = client.info("memory")["used_memory"]
    drop_prefix(redis_url, f"{name}-kafka-python")
    return (after - before) / requests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--estimator",
        default="none",
        choices=["none", "randomized", "harvesting", "em"],
        help="propensity estimation on (its counters cost one HINCRBY per shown position)",
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--attribution-window",
        default="30m",
        help="e.g. 5m: requests become due during the run, so finalisation is measured too",
    )
    parser.add_argument("--log-dir", type=Path, help="keep the evaluator logs here")
    parser.add_argument(
        "--spacing-ms",
        type=int,
        default=20,
        help="event time between impressions; 120 spreads 60,000 requests over 2 h so "
        "that most are finalised during the run (20: almost none are)",
    )
    parser.add_argument(
        "--clients",
        default="kafka-python,confluent",
        help="comma-separated kafka.client values to measure side by side",
    )
    args = parser.parse_args()
    global ESTIMATOR, ATTRIBUTION_WINDOW  # noqa: PLW0603 - benchmark knobs
    ESTIMATOR = args.estimator
    ATTRIBUTION_WINDOW = args.attribution_window
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    redis_url = os.environ["REDIS_URL"]
    imps, ints = events(args.requests, spacing_ms=args.spacing_ms)
    total = len(imps) + len(ints)
    clients = args.clients.split(",")
    raws: dict[str, list[tuple[float, float]]] = {c: [] for c in clients}
    evals: dict[str, list[Measured]] = {c: [] for c in clients}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = str(args.log_dir or scratch)
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for i in range(args.repeats):
            name = f"bench-{uuid.uuid4().hex[:6]}"
            produce(bootstrap, name, imps, ints)
            for client in clients:
                rate, cpu = raw_rate(bootstrap, name, total, client)
                raws[client].append((rate, cpu))
                log = Path(tmp) / f"{i}-{client}.log"
                got = evaluator_rate(bootstrap, redis_url, name, total, log, client=client)
                evals[client].append(got)
                print(
                    f"  run {i + 1} {client}: raw {rate:,.0f} ev/s ({cpu:.1f} CPU µs/ev), "
                    f"evaluator {got.rate:,.0f} ev/s ({got.cpu_us:.1f} CPU µs/ev, "
                    f"Redis {got.redis_cpu_us:.1f}), ratio {got.rate / rate:.2f}, "
                    f"{finalised(redis_url, f'{name}-{client}'):,} requests finalised"
                )
                drop_prefix(redis_url, f"{name}-{client}")
        mem = (
            0.0
            if args.skip_memory
            else memory_per_request(bootstrap, redis_url, 20_000, Path(tmp) / "mem.log")
        )
    print(f"machine: {machine()}")
    print(
        f"{total:,} events ({args.requests:,} impressions of 20 items), medians of {args.repeats}"
    )
    for client in clients:
        raw = statistics.median(r for r, _ in raws[client])
        cpu_raw = statistics.median(c for _, c in raws[client])
        ev = statistics.median(m.rate for m in evals[client])
        cpu_ev = statistics.median(m.cpu_us for m in evals[client])
        cpu_redis = statistics.median(m.redis_cpu_us for m in evals[client])
        print(
            f"  {client:13}: raw {raw:10,.0f} ev/s, evaluator {ev:10,.0f} ev/s -> "
            f"{ev / raw:.2f} of its ceiling; CPU µs/event raw {cpu_raw:.1f}, evaluator "
            f"{cpu_ev:.1f} ({cpu_raw / cpu_ev:.2f}), Redis {cpu_redis:.1f}"
        )
    print(
        f"  propensity.estimator       : {args.estimator}, spacing {args.spacing_ms} ms, "
        f"attribution window {args.attribution_window}"
    )
    if not args.skip_memory:
        print(f"  Redis memory per open request (20 items): {mem:,.0f} bytes")


if __name__ == "__main__":
    main()
