"""Time of one /metrics scrape with 10 variants x 2 K x 3 windows x 3 cohorts.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_scrape.py [--repeats 30]

Fills a fresh Redis prefix with a day of finalised requests for 10 variants over
4 partitions, written by partition checkpoints as `evaluator run` writes them
(every bucket of every window populated), then times the full exposition
(`generate_latest`): the first scrape with cold caches, scrapes with nothing
new, and scrapes right after 500 new requests were committed (live traffic).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import urllib.request
import uuid

import numpy as np
from _common import machine
from prometheus_client import CollectorRegistry, generate_latest

from evaluator.adapters.prometheus.collector import WindowCollector
from evaluator.adapters.redis.store import RedisStore, connect
from evaluator.adapters.web.http import Refreshed, serve
from evaluator.config import load_settings
from evaluator.config.plain import readout_config
from evaluator.core.due import OpenRequest
from evaluator.core.finalise import Finalised
from evaluator.engine.checkpoint import Delta
from evaluator.readout.live import LiveReader

T0 = 1_700_000_000_000
DAY = 86_400_000


PARTITIONS = 4


class Owner:
    """Writes finalised requests into the store as the owner of every partition."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.claims = {p: store.claim(p) for p in range(PARTITIONS)}
        self.seq = {p: c.seq for p, c in self.claims.items()}

    def commit(self, done: Finalised, partition: int) -> None:
        delta = Delta({}, {"finalised": len(done.requests)}, {}, {}, None, 0, None, [done])
        claim = self.claims[partition]
        assert (
            self.store.checkpoint(partition, claim.epoch, self.seq[partition], delta).value
            == "written"
        )
        self.seq[partition] += 1


def commit_batch(
    owner: Owner,
    rng: np.random.Generator,
    first: int,
    n: int,
    *,
    variants: int,
    lo_ms: int,
    hi_ms: int,
) -> None:
    """Checkpoint ``n`` finalised requests with deadlines in [lo_ms, hi_ms), spread over
    the partitions."""
    layout = owner.store.layout
    for partition in range(PARTITIONS):
        m = n // PARTITIONS + (partition < n % PARTITIONS)
        reqs = [
            OpenRequest(
                f"r{first + partition}-{i}",
                f"u{rng.integers(50_000)}",
                f"v{i % variants}",
                0,
                [f"p{rng.integers(20_000)}" for _ in range(20)],
            )
            for i in range(m)
        ]
        rows = rng.random((m, layout.row_width))
        rows[:, 0] = 1
        deadline = np.sort(rng.integers(lo_ms, hi_ms, m)).astype(np.int64)
        local = rng.integers(0, layout.local_buckets, m)
        done = Finalised.of(
            reqs, rows, rng.integers(0, 2, m), partition + PARTITIONS * local, deadline
        )
        owner.commit(done, partition)


def fill(owner: Owner, requests: int, variants: int, seed: int = 0) -> int:
    """A day of finalised requests; returns the frontier (end of the day)."""
    rng = np.random.default_rng(seed)
    for start in range(0, requests, 5_000):
        commit_batch(
            owner,
            rng,
            start,
            min(5_000, requests - start),
            variants=variants,
            lo_ms=T0,
            hi_ms=T0 + DAY,
        )
    return int(T0 + DAY)


def timed(registry: CollectorRegistry) -> tuple[float, bytes]:
    """What `evaluator run` serves on /metrics, read afresh: the registry's exposition
    with the window collector registered."""
    start = time.perf_counter()
    text = generate_latest(registry)
    return time.perf_counter() - start, text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--requests", type=int, default=50_000)
    args = parser.parse_args()
    prefix = f"bench-scrape-{uuid.uuid4().hex[:6]}"
    settings = load_settings(environ={"EVALUATOR_REDIS__KEY_PREFIX": prefix})
    layout = settings.layout(PARTITIONS)
    store = RedisStore(connect(os.environ["REDIS_URL"]), layout, prefix=prefix)
    owner = Owner(store)
    frontier = fill(owner, args.requests, variants=10)
    registry = CollectorRegistry()  # process counters would be here too
    collector = WindowCollector(LiveReader(store, readout_config(settings), lambda: frontier))
    registry.register(collector)
    cold, _ = timed(registry)
    rng = np.random.default_rng(1)
    warm, steady = [], []
    for i in range(args.repeats):
        warm.append(timed(registry)[0])
        # live traffic: 500 more requests land in the newest minute before the next scrape
        commit_batch(
            owner, rng, 10**7 + i * 500, 500, variants=10, lo_ms=frontier - 60_000, hi_ms=frontier
        )
        seconds, text = timed(registry)
        steady.append(seconds)
    # what `evaluator run` does by default: refresh in the background, serve the copy
    cached = Refreshed(collector.read, 1.0)
    collector.attach(cached.get)
    server = serve(registry, "127.0.0.1", 0, alive=lambda: True, ready=lambda: (True, ""))
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    http, refresh = [], []
    for i in range(args.repeats):
        commit_batch(
            owner,
            rng,
            2 * 10**7 + i * 500,
            500,
            variants=10,
            lo_ms=frontier - 60_000,
            hi_ms=frontier,
        )
        start = time.perf_counter()
        with urllib.request.urlopen(url) as reply:
            reply.read()
        http.append(time.perf_counter() - start)
        refresh.append(cached.last_seconds)
    cached.close()
    server.shutdown()
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    print(f"machine: {machine()}")
    print(
        f"10 variants x 2 K x 3 windows x 3 cohorts: {series} series, "
        f"{len(text):,} bytes, median of {args.repeats}"
    )
    print(f"  first scrape (cold caches)            : {cold * 1000:7.1f} ms")
    print(f"  scrape, nothing new since the last one: {statistics.median(warm) * 1000:7.1f} ms")
    print(f"  scrape after 500 new requests         : {statistics.median(steady) * 1000:7.1f} ms")
    print(
        f"  GET /metrics, background refresh (1 s): {statistics.median(http) * 1000:7.1f} ms "
        f"(one refresh takes {statistics.median(refresh) * 1000:.1f} ms on its thread)"
    )


if __name__ == "__main__":
    main()
