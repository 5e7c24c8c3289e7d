"""Time of one /metrics scrape with 10 variants x 2 K x 3 windows x 3 cohorts.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_scrape.py [--repeats 30]

Fills a fresh Redis prefix with a day of finalised requests for 10 variants
(every bucket of every window populated), then times the full exposition
(`generate_latest`) beside the bare read of the window blocks it needs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections import Counter

import numpy as np
from _common import machine
from prometheus_client import CollectorRegistry, generate_latest

from evaluator.config import load_settings
from evaluator.exporters.prometheus import WindowCollector
from evaluator.finalise import Finalised, OpenRequest
from evaluator.stores.redis import RedisStore, connect

T0 = 1_700_000_000_000
DAY = 86_400_000


def fill(store: RedisStore, requests: int, variants: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    layout = store.layout
    batch = 5_000
    for start in range(0, requests, batch):
        n = min(batch, requests - start)
        reqs = [
            OpenRequest(
                f"r{start + i}",
                f"u{rng.integers(50_000)}",
                f"v{i % variants}",
                0,
                [f"p{rng.integers(20_000)}" for _ in range(20)],
            )
            for i in range(n)
        ]
        rows = rng.random((n, layout.row_width))
        rows[:, 0] = 1
        deadline = T0 + np.sort(rng.integers(0, DAY, n))
        done = Finalised(
            reqs,
            rows,
            rng.integers(0, 2, n),
            rng.integers(0, layout.user_buckets, n),
            deadline.astype(np.int64),
            Counter(),
        )
        # requests must be open to be claimed: store them as the ingest script would
        pipe = store.client.pipeline(transaction=False)
        for r, bucket in zip(reqs, done.user_bucket.tolist(), strict=True):
            pipe.set(f"{store.tag(bucket % layout.shards)}r:{r.request_id}", "x")
        pipe.execute()
        store.commit(done)
    return int(T0 + DAY)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--requests", type=int, default=50_000)
    args = parser.parse_args()
    prefix = f"bench-scrape-{uuid.uuid4().hex[:6]}"
    settings = load_settings(environ={"EVALUATOR_REDIS__KEY_PREFIX": prefix})
    store = RedisStore(connect(os.environ["REDIS_URL"]), settings.layout(), prefix=prefix)
    frontier = fill(store, args.requests, variants=10)
    registry = CollectorRegistry()
    registry.register(WindowCollector(store, settings, lambda: frontier))
    generate_latest(registry)  # warm up
    scrape, reads = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        text = generate_latest(registry)
        scrape.append(time.perf_counter() - start)
        start = time.perf_counter()
        for window in store.layout.windows_ms:
            store.blocks(window, frontier - window - store.layout.bucket_width(window), frontier)
        reads.append(time.perf_counter() - start)
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    print(f"machine: {machine()}")
    print(
        f"10 variants x 2 K x 3 windows x 3 cohorts: {series} series, "
        f"{len(text):,} bytes, median of {args.repeats}"
    )
    print(f"  /metrics scrape      : {statistics.median(scrape) * 1000:7.1f} ms")
    print(
        f"  bare block reads     : {statistics.median(reads) * 1000:7.1f} ms "
        f"(share of the scrape: {statistics.median(reads) / statistics.median(scrape):.2f})"
    )


if __name__ == "__main__":
    main()
