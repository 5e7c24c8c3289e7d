"""Memory per interaction waiting in a partition's state: one naming an open request,
and one without a request id ("loose") waiting for its user's requests to finalise.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_open_interactions.py [--requests 100000] [--history 3]

One engine (24 h attribution window, so nothing is final) opens ``--requests``
requests of 20 items (UUID request ids, users of ~4 requests each) and checkpoints
them to Redis, then ingests one click per request, on an item it showed (UUID event
ids), checkpointing every 5,000: first clicks naming their request, then, on a
second engine, clicks without a request id. Reported per interaction: the growth of
the partition's state hash (``MEMORY USAGE``) and the process's traced allocations
(tracemalloc) over the clicks. ``--history``: ``cold_start.min_relevant_history``
(the default 3 also keeps each user's first relevant interactions, a cost per user
rather than per interaction; 0 keeps none, so the figures are the interactions'
own). Issue 33: an open request costs ~150-200 bytes in the process and ~120 in
Redis; with a long attribution window, the interactions waiting with it count as much.
"""

from __future__ import annotations

import argparse
import json
import os
import tracemalloc
import uuid

import redis
from _common import machine
from bench_partition import impressions

from evaluator.adapters.redis.store import RedisStore, connect
from evaluator.config import load_settings
from evaluator.config.plain import tasks_config
from evaluator.core.decode import decode_impressions, decode_interactions
from evaluator.core.events import ImpressionBatch, InteractionBatch
from evaluator.engine.runtime import tune_gc
from evaluator.engine.tasks import Tasks

BATCH = 5_000


def clicks(shown: list[bytes], named: bool) -> list[bytes]:
    """One click per impression on its first item, 5 ms after it (naming its request
    or not)."""
    out = []
    for payload in shown:
        imp = json.loads(payload)
        click = {
            "event_id": f"evt-{uuid.uuid4()}",
            "user_id": imp["user_id"],
            "item_id": imp["items"][0],
            "type": "click",
            "timestamp": imp["timestamp"] + 5,
        }
        if named:
            click["request_id"] = imp["request_id"]
        out.append(json.dumps(click).encode())
    return out


def measure(shown: list[bytes], named: bool, history: int, url: str) -> tuple[float, float]:
    """Bytes per waiting click in Redis and in the process."""
    overrides = {
        "join": {"attribution_window": "24h"},
        "cold_start": {"min_relevant_history": history},
    }
    settings = load_settings(environ={}, overrides=overrides)
    prefix = f"bench-ints-{uuid.uuid4().hex[:6]}"
    raw = redis.Redis.from_url(url)
    tasks = Tasks(
        RedisStore(connect(url), settings.layout(1), prefix=prefix), tasks_config(settings, 1)
    )
    tasks.assign([0])
    owned = tasks.owned[0]
    engine = owned.engine
    for start in range(0, len(shown), BATCH):
        batch, _ = decode_impressions(shown[start : start + BATCH])
        engine.ingest(batch, InteractionBatch())
        tasks._checkpoint(0, owned)
    state = f"{{{prefix}:0}}:state"
    payloads = clicks(shown, named)
    profile = settings.relevance.active()
    before = int(raw.memory_usage(state, samples=0) or 0)  # type: ignore[arg-type]
    tracemalloc.start()
    for start in range(0, len(payloads), BATCH):
        got, _ = decode_interactions(payloads[start : start + BATCH], profile)
        engine.ingest(ImpressionBatch(), got)
        del got  # the decoded events are not state
        tasks._checkpoint(0, owned)
    process = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert engine.open_requests() == len(shown)  # nothing final: every click waits
    grown = int(raw.memory_usage(state, samples=0) or 0) - before  # type: ignore[arg-type]
    for key in raw.scan_iter(f"{{{prefix}:*", count=1000):
        raw.unlink(key)
    raw.delete(f"{{{prefix}:meta}}:layout")
    return grown / len(shown), process / len(shown)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=3)
    args = parser.parse_args()
    tune_gc()  # as `evaluator run` does at start-up
    url = os.environ["REDIS_URL"]
    shown = impressions(args.requests, long_ids=True)
    print(f"machine: {machine()}")
    print(
        f"{args.requests:,} open requests of 20 items (24 h attribution window), one click "
        f"each, min_relevant_history = {args.history}; per waiting click:"
    )
    for named in (True, False):
        redis_bytes, process = measure(shown, named, args.history, url)
        kind = "naming its open request" if named else "request-less (loose)   "
        print(f"  {kind}: Redis {redis_bytes:,.1f} bytes, process {process:,.1f} bytes")


if __name__ == "__main__":
    main()
