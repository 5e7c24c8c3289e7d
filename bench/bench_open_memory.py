"""Memory per open request of a live `evaluator run`: process RSS and Redis, after a warm-up.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_open_memory.py [--requests 100000] [--warmup 20000]

One `python -m evaluator run` (defaults, but a 24 h attribution window, so nothing
is finalised) consumes ``--warmup`` impressions of 20 items with a diversity
attribute (a catalog of 50,000 items, ids as long as real ones); then
``--requests`` more. Reported: the growth of the process's resident set (VmRSS)
and of Redis's ``used_memory`` between the two points (each taken once every
offset is committed, so the state is checkpointed), per open request added. The
warm-up takes the one-off costs (imports, the codebook of the catalog, buffers)
out of the figure, as they would be out of a long-running process's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis
from _common import machine
from bench_partition import impressions
from bench_run import committed, drop_prefix, evaluator_env, produce, start_evaluator
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def wait_committed(
    admin: KafkaAdminClient, group: str, total: int, proc: subprocess.Popen[bytes]
) -> None:
    while True:
        try:
            if committed(admin, group) >= total:
                return
        except KafkaError:  # a fresh broker: no group coordinator yet
            pass
        if proc.poll() is not None:
            raise SystemExit("evaluator exited")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=20_000)
    args = parser.parse_args()
    bootstrap, url = os.environ["KAFKA_BOOTSTRAP_SERVERS"], os.environ["REDIS_URL"]
    name = f"bench-open-{uuid.uuid4().hex[:6]}"
    payloads = impressions(args.warmup + args.requests, long_ids=True)
    warm, rest = payloads[: args.warmup], payloads[args.warmup :]
    produce(bootstrap, name, warm, [])
    env = {
        **evaluator_env(bootstrap, url, name, name),
        "EVALUATOR_JOIN__ATTRIBUTION_WINDOW": "24h",
        "EVALUATOR_HTTP__PORT": "0",
    }
    client = redis.Redis.from_url(url)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "run.log", "wb") as log:
        proc = start_evaluator(env, log)
        try:
            wait_committed(admin, f"{name}-eval", len(warm), proc)
            rss0, redis0 = rss_bytes(proc.pid), client.info("memory")["used_memory"]
            from kafka import KafkaProducer

            producer = KafkaProducer(
                bootstrap_servers=bootstrap, linger_ms=20, batch_size=256_000, acks=1
            )
            for payload in rest:
                key = json.loads(payload)["user_id"].encode()
                producer.send(f"{name}-impressions", payload, key=key)
            producer.flush()
            producer.close()
            wait_committed(admin, f"{name}-eval", len(payloads), proc)
            rss1, redis1 = rss_bytes(proc.pid), client.info("memory")["used_memory"]
        finally:
            proc.terminate()
            proc.wait()
    admin.close()
    drop_prefix(url, name)
    print(f"machine: {machine()}")
    print(f"{args.requests:,} open requests of 20 items after {args.warmup:,} (24 h window)")
    print(f"  process RSS per open request : {(rss1 - rss0) / args.requests:,.0f} bytes")
    print(f"  Redis memory per open request: {(redis1 - redis0) / args.requests:,.0f} bytes")


if __name__ == "__main__":
    main()
