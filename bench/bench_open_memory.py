"""Memory per open request of a live `evaluator run`: process RSS and Redis, after a warm-up.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_open_memory.py [--requests 100000] [--warmup 60000]
        [--steps 4] [--clicks named|loose]

One `python -m evaluator run` (defaults, but a 24 h attribution window, so nothing
is finalised) consumes ``--warmup`` impressions of 20 items with a diversity
attribute (a catalog of 50,000 items, ids as long as real ones); then
``--requests`` more, in ``--steps`` equal steps. Reported: the growth of the
process's resident set (VmRSS) and of Redis's ``used_memory`` per open request
added, from the warm-up's end to the last step (each point taken once every
offset is committed, so the state is checkpointed), and over the steps: each
step's and the least-squares slope through every point. The warm-up takes the
one-off costs out of the figure, as they would be out of a long-running
process's: imports, buffers, the allocators' pools, and the codebook of the
catalog, which each of the 4 partitions holds for itself. 60,000 impressions give
each partition 300,000 item draws, so its codebook holds all but ~0.25% of the
catalog; the 20,000 of sessions 26-41 gave 100,000, and ~14% of the catalog per
partition (27,000 strings of the 4 codebooks, ~25 bytes per open request) then
entered the figure, with the allocators' growth to their steady state: 300-560
bytes from run to run where 60,000 give 150-240 (BENCHMARKS.md, session 42).
With ``--clicks``, one click per request of the ``--requests`` then follows, on an
item it showed, naming its request (``named``) or without a request id (``loose``),
in the same steps: the same growths per waiting click (each waits, as its request
does, for the 24 h window).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis
from _common import machine
from bench_open_interactions import clicks
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
    parser.add_argument("--warmup", type=int, default=60_000)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--clicks", choices=["named", "loose"])
    args = parser.parse_args()
    bootstrap, url = os.environ["KAFKA_BOOTSTRAP_SERVERS"], os.environ["REDIS_URL"]
    name = f"bench-open-{uuid.uuid4().hex[:6]}"
    payloads = impressions(args.warmup + args.requests, long_ids=True)
    warm, rest = payloads[: args.warmup], payloads[args.warmup :]
    bounds = [round(args.requests * k / args.steps) for k in range(args.steps + 1)]
    produce(bootstrap, name, warm, [])
    env = {
        **evaluator_env(bootstrap, url, name, name),
        "EVALUATOR_JOIN__ATTRIBUTION_WINDOW": "24h",
        "EVALUATOR_HTTP__PORT": "0",
    }
    client = redis.Redis.from_url(url)
    report: list[tuple[str, list[tuple[int, int]]]] = []
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "run.log", "wb") as log:
        proc = start_evaluator(env, log)
        try:
            wait_committed(admin, f"{name}-eval", len(warm), proc)
            from kafka import KafkaProducer

            producer = KafkaProducer(
                bootstrap_servers=bootstrap, linger_ms=20, batch_size=256_000, acks=1
            )

            def probe() -> tuple[int, int]:
                return rss_bytes(proc.pid), client.info("memory")["used_memory"]

            done = args.warmup
            for topic, batch in [("impressions", rest)] + (
                [("interactions", clicks(rest, args.clicks == "named"))] if args.clicks else []
            ):
                points = [probe()]  # a click's figures start where the requests' end
                for first, end in itertools.pairwise(bounds):
                    for payload in batch[first:end]:
                        key = json.loads(payload)["user_id"].encode()
                        producer.send(f"{name}-{topic}", payload, key=key)
                    producer.flush()
                    wait_committed(admin, f"{name}-eval", done + end, proc)
                    points.append(probe())
                done += len(batch)
                report.append((topic, points))
            producer.close()
        finally:
            proc.terminate()
            proc.wait()
    admin.close()
    drop_prefix(url, name)
    print(f"machine: {machine()}")
    print(
        f"{args.requests:,} open requests of 20 items after {args.warmup:,} (24 h window), "
        f"{args.steps} steps"
    )
    for topic, points in report:
        unit = "open request" if topic == "impressions" else f"waiting click ({args.clicks})"
        for label, column in (("process RSS", 0), ("Redis memory", 1)):
            _print_growth(f"{label} per {unit}", [point[column] for point in points], bounds)


def _print_growth(label: str, values: list[int], bounds: list[int]) -> None:
    """Growth per unit from the first point to the last, each step's, and the slope."""
    steps = [
        (b - a) / (n1 - n0)
        for (a, b), (n0, n1) in zip(
            itertools.pairwise(values), itertools.pairwise(bounds), strict=True
        )
    ]
    fit = statistics.linear_regression(bounds, values).slope
    print(
        f"  {label}: {(values[-1] - values[0]) / bounds[-1]:,.0f} bytes "
        f"(slope {fit:,.0f}; steps {', '.join(f'{s:,.0f}' for s in steps)})"
    )


if __name__ == "__main__":
    main()
