"""A partition's state: memory per open request (Redis and process) and the time a new
owner takes to load a partition holding many open requests.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_partition.py [--requests 100000]

One engine ingests impressions of 20 items (with a diversity attribute) and
checkpoints them to Redis in batches of 5,000, nothing finalised: first
``--warmup`` of them (untraced: the catalog's codebook and the process's one-off
allocations, as in a long-running process), then ``--requests`` more. Reported:
the partition state hash's ``MEMORY USAGE`` (every field counted) per open request,
the process's traced allocations per open request added after the warm-up
(tracemalloc: the engine's state, including each new user's A/B exposure), of which
the open-request columns' own arrays, and the median over repeats of claim + load + rebuild by a new
owner (``Tasks.assign``), with the garbage collector tuned as ``evaluator run`` tunes it.
Then the new owner finalises every request: per finalised marker (what
``engine.finalised_ttl`` keeps), the bytes of its ``g:`` segments and of what the
state hash still holds (each user's exposure and the codebook too), and what
finalisation left allocated in the process, of which the markers' own arrays (the
rest is one-off: modules finalisation imports first). Last, ``--requests``
request-less interactions that come late (before the join horizon, within the marker
TTL) each leave a marker of their event id, as do loose interactions that a request
took or that expired unjoined: per marker, the state hash's growth, the process's
traced allocations and the markers' arrays' growth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc
import uuid

import redis
from _common import machine

from evaluator.adapters.redis.store import RedisStore, connect
from evaluator.config import Settings, load_settings
from evaluator.config.plain import tasks_config
from evaluator.core.decode import decode_impressions, decode_interactions
from evaluator.core.events import ImpressionBatch, InteractionBatch
from evaluator.engine.runtime import tune_gc
from evaluator.engine.tasks import Tasks

T0 = 1_700_000_000_000


def impressions(n: int, seed: int = 0, *, long_ids: bool = False) -> list[bytes]:
    """Impressions of 20 items of a 50,000-item catalog with a category each, users
    of ~4 each; ``long_ids``: ids as long as real ones (UUID request ids, ~15-character
    items), 20 ms apart (else short ids, 1 ms apart)."""
    import random

    rng = random.Random(seed)
    out = []
    for r in range(n):
        if long_ids:
            item = "sku-{:08d}-eu".format
            rid, uid = (
                f"req-{uuid.UUID(int=rng.getrandbits(128))}",
                f"user-{rng.randrange(n // 4):08d}",
            )
        else:
            item, rid, uid = "p{}".format, f"r{r}", f"u{rng.randrange(n // 4)}"
        items = list(dict.fromkeys(item(rng.randrange(50_000)) for _ in range(20)))
        out.append(
            json.dumps(
                {
                    "event_id": f"i{r}",
                    "request_id": rid,
                    "user_id": uid,
                    "variant": "AB"[r % 2],
                    "timestamp": T0 + (20 * r if long_ids else r),
                    "items": items,
                    "item_attributes": {"category": [f"c{rng.randrange(20)}" for _ in items]},
                }
            ).encode()
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tune_gc()  # as `evaluator run` does at start-up
    url = os.environ["REDIS_URL"]
    settings = load_settings(environ={})
    prefix = f"bench-part-{uuid.uuid4().hex[:6]}"
    store = RedisStore(connect(url), settings.layout(1), prefix=prefix)
    raw = redis.Redis.from_url(url)
    payloads = impressions(args.warmup + args.requests)
    tasks = Tasks(store, tasks_config(settings, 1))
    tasks.assign([0])
    owned = tasks.owned[0]
    engine = owned.engine
    table_bytes = 0
    for start in range(0, len(payloads), 5_000):
        if start == args.warmup:
            tracemalloc.start()
            table_bytes = engine.state.requests.nbytes
        batch, _ = decode_impressions(payloads[start : start + 5_000])
        engine.ingest(batch, InteractionBatch())
        del batch  # the decoded events are not state
        owned.offsets["impressions"] = start + 5_000
        owned.consumed = True
        tasks._checkpoint(0, owned)
    process_bytes = tracemalloc.get_traced_memory()[0] / args.requests
    tracemalloc.stop()
    table_bytes = (engine.state.requests.nbytes - table_bytes) / args.requests
    state = f"{{{prefix}:0}}:state"
    total = args.warmup + args.requests
    redis_bytes = int(raw.memory_usage(state, samples=0) or 0) / total  # type: ignore[arg-type]
    loads = []
    for _ in range(args.repeats):
        other = Tasks(store, tasks_config(settings, 1))
        started = time.perf_counter()
        other.assign([0])
        loads.append(time.perf_counter() - started)
        loaded = other.owned[0].engine.open_requests()
        assert loaded == total, (loaded, engine.open_requests())
    markers = _markers(other, raw, state, total)
    seen = _seen_markers(other, raw, state, args.requests, settings)
    print(f"machine: {machine()}")
    print(
        f"{args.requests:,} open requests of 20 items (with a diversity attribute), "
        f"after {args.warmup:,}"
    )
    print(f"  Redis memory per open request  : {redis_bytes:,.0f} bytes (all {total:,})")
    print(f"  process memory per open request: {process_bytes:,.0f} bytes (tracemalloc)")
    print(f"    of which the request columns : {table_bytes:,.0f} bytes")
    print(
        f"  new owner's load of {total:,} (claim, read, rebuild): "
        f"median {statistics.median(loads):.2f} s"
    )
    _print_markers(*markers)
    _print_seen(args.requests, *seen)
    _drop(raw, prefix)


def _drop(raw: redis.Redis, prefix: str) -> None:
    """The run's keys."""
    for key in raw.scan_iter(f"{{{prefix}:*", count=1000):
        raw.unlink(key)
    raw.delete(f"{{{prefix}:meta}}:layout")


def _print_markers(hash_bytes: float, segments: float, process: float, arrays: float) -> None:
    print(f"  Redis per finalised marker, its segments (g:): {segments:,.1f} bytes")
    print(f"    the state hash left (exposures, codebook too): {hash_bytes:,.0f} bytes")
    print(f"  process memory per finalised marker: {process:,.0f} bytes (tracemalloc)")
    print(f"    of which the markers' arrays     : {arrays:,.1f} bytes")


def _print_seen(n: int, redis_bytes: float, process: float, arrays: float) -> None:
    print(f"  a late request-less interaction's marker, {n:,} of them:")
    print(f"    Redis (the state hash's growth): {redis_bytes:,.1f} bytes")
    print(f"    process memory (tracemalloc)   : {process:,.1f} bytes")
    print(f"    of which the markers' arrays   : {arrays:,.1f} bytes")


def _markers(
    tasks: Tasks, raw: redis.Redis, state: str, n: int
) -> tuple[float, float, float, float]:
    """Finalise every open request of the loaded partition and checkpoint: bytes per
    finalised marker in the state hash (all it still holds), in its marker segments, in
    the process, and in the markers' own arrays."""
    owned = tasks.owned[0]
    engine = owned.engine
    tracemalloc.start()
    # every deadline passed; markers stay (they expire by the data's own time, the
    # latest impression's)
    latest = max(int(chunk.ts.max()) for chunk in engine.state.requests.chunks)
    for clock in engine.inputs.values():
        clock.max_event_ms = latest
    engine.watermark_ms = T0 + n + 86_400_000
    owned.done += engine.finalise_due()
    assert engine.open_requests() == 0
    tasks._checkpoint(0, owned)
    process = tracemalloc.get_traced_memory()[0] / n
    tracemalloc.stop()
    markers = engine.state.markers
    assert len(markers) == n
    segments = sum(len(k) + len(v) for k, v in raw.hscan_iter(state, match="g:*", count=1000))
    return (
        int(raw.memory_usage(state, samples=0) or 0) / n,  # type: ignore[arg-type]
        segments / n,
        process,
        markers.nbytes / n,
    )


def _seen_markers(
    tasks: Tasks, raw: redis.Redis, state: str, n: int, settings: Settings
) -> tuple[float, float, float]:
    """Request-less interactions (UUID event ids) that come late to the partition
    :func:`_markers` finalised, checkpointed in batches of 5,000: bytes per marker in
    the state hash, in the process and in the markers' arrays."""
    owned = tasks.owned[0]
    engine = owned.engine
    latest = engine.settled_ms()  # the marker TTL counts back from the data's time
    assert engine.watermark_ms is not None and latest is not None
    assert latest < engine.watermark_ms - engine.config.horizon_ms - n  # all late
    payloads = [
        json.dumps(
            {
                "event_id": f"evt-{uuid.uuid4()}",
                "user_id": f"u{i % 10}",  # few: their cold-start histories cost ~nothing
                "item_id": f"p{i % 50_000}",
                "type": "click",
                "timestamp": latest + i,
            }
        ).encode()
        for i in range(n)
    ]
    profile = settings.relevance.active()
    hash_before = int(raw.memory_usage(state, samples=0) or 0)  # type: ignore[arg-type]
    arrays_before = engine.state.markers.nbytes
    held_before = len(engine.state.markers.applied)
    tracemalloc.start()
    for start in range(0, n, 5_000):
        batch, _ = decode_interactions(payloads[start : start + 5_000], profile)
        engine.ingest(ImpressionBatch(), batch)
        del batch
        tasks._checkpoint(0, owned)
    process = tracemalloc.get_traced_memory()[0] / n
    tracemalloc.stop()
    assert len(engine.state.markers.applied) - held_before == n  # each late, marked
    grown = int(raw.memory_usage(state, samples=0) or 0) - hash_before  # type: ignore[arg-type]
    return grown / n, process, (engine.state.markers.nbytes - arrays_before) / n


if __name__ == "__main__":
    main()
