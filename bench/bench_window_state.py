"""Redis memory of the window state per variant, at the default windows.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_window_state.py [--hours 72] [--per-bucket 4]

One partition's engine finalises requests of one variant, ``--per-bucket`` in every
25-second bucket (the 5-minute window's), over ``--hours`` of event time, and
checkpoints to Redis after each bucket. Reported per window: the blocks the store
keeps (dropped two window lengths behind the newest, by event time) and their
``MEMORY USAGE``; the coverage sketches, which expire by their wall-clock TTL
(2 x window + 1 h): their bytes per key times the keys a real-time run keeps (the
benchmark runs far faster than real time, so every sketch it wrote is still there).
The sum is the window state one variant costs, whatever the traffic.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import uuid

import redis
from _common import machine

from evaluator.adapters.redis.store import RedisStore, connect
from evaluator.config import load_settings
from evaluator.config.plain import tasks_config
from evaluator.core.decode import decode_impressions
from evaluator.core.events import InteractionBatch
from evaluator.core.windows import block_ttl_s
from evaluator.engine.tasks import Tasks

T0 = 1_700_000_000_000
BUCKET_MS = 25_000


def impressions(first: int, n: int, ts: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "event_id": f"i{r}",
                "request_id": f"r{r}",
                "user_id": f"u{r % 997}",
                "variant": "A",
                "timestamp": ts,
                "items": [f"p{(r * 7 + j) % 5_000}" for j in range(20)],
                "item_attributes": {"category": [f"c{j % 9}" for j in range(20)]},
            }
        ).encode()
        for r in range(first, first + n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=72.0)
    parser.add_argument("--per-bucket", type=int, default=4)
    args = parser.parse_args()
    url = os.environ["REDIS_URL"]
    settings = load_settings(environ={})
    prefix = f"bench-win-{uuid.uuid4().hex[:6]}"
    store = RedisStore(connect(url), settings.layout(1), prefix=prefix)
    raw = redis.Redis.from_url(url)
    tasks = Tasks(store, tasks_config(settings, 1))
    tasks.assign([0])
    owned = tasks.owned[0]
    engine = owned.engine
    buckets = int(args.hours * 3_600_000 / BUCKET_MS)
    for b in range(buckets):
        ts = T0 + b * BUCKET_MS
        batch, _ = decode_impressions(impressions(b * args.per_bucket, args.per_bucket, ts))
        engine.ingest(batch, InteractionBatch())
        engine.watermark_ms = ts  # everything whose deadline passed is final
        owned.done += engine.finalise_due()
        owned.consumed = True
        tasks._checkpoint(0, owned)
    layout = store.layout
    print(f"machine: {machine()}")
    print(
        f"{buckets:,} buckets of 25 s ({args.hours:g} h of event time), "
        f"{args.per_bucket} requests each, one variant, default windows"
    )
    total = 0.0
    for window in layout.windows_ms:
        blocks = list(raw.scan_iter(f"{{{prefix}:0}}:b:{window}:*", count=1000))
        block_bytes = sum(int(raw.memory_usage(k, samples=0) or 0) for k in blocks)  # type: ignore[arg-type]
        sketches = list(raw.scan_iter(f"{{{prefix}:hcov}}:{window}:*", count=1000))
        per_sketch = max(int(raw.memory_usage(k, samples=0) or 0) for k in sketches)  # type: ignore[arg-type]
        width = layout.bucket_width(window)
        kept = math.ceil(block_ttl_s(window) * 1000 / width)
        keys_per_bucket = len(sketches) / len({k.split(b":")[3] for k in sketches})
        sketch_bytes = per_sketch * keys_per_bucket * kept
        total += block_bytes + sketch_bytes
        print(
            f"  window {window // 1000:>6} s: {len(blocks):>3} blocks, "
            f"{block_bytes / 1e6:6.2f} MB; sketches {keys_per_bucket:.0f} per bucket x "
            f"{kept} buckets at real time x {per_sketch / 1e3:.1f} KB = "
            f"{sketch_bytes / 1e6:6.2f} MB"
        )
    print(f"  window state per variant: {total / 1e6:.1f} MB")
    history(raw, prefix, layout.history_keep_ms)
    for key in raw.scan_iter(f"{{{prefix}:*", count=1000):
        raw.unlink(key)
    raw.delete(f"{{{prefix}:meta}}:layout")


def history(raw: redis.Redis, prefix: str, keep_ms: int) -> None:
    """The regression detector's history: one array per hour and variant (final, and
    provisional under a marked name) plus its index entry, kept ``keep_ms``."""
    arrays = list(raw.scan_iter(f"{{{prefix}:0}}:rh:*", count=1000))
    if not arrays:
        return
    size = sum(int(raw.memory_usage(k, samples=0) or 0) for k in arrays)  # type: ignore[arg-type]
    index = int(raw.memory_usage(f"{{{prefix}:0}}:rhi", samples=0) or 0)  # type: ignore[arg-type]
    per_array = (size + index) / len(arrays)
    provisional = sum(1 for k in arrays if b"\x1d" in k)
    hours = keep_ms / 3_600_000
    per_variant = per_array * hours * (2 if provisional else 1)
    print(
        f"  regression history: {len(arrays)} arrays ({provisional} provisional), "
        f"{per_array:.0f} bytes per hour and variant with its index entry; kept "
        f"{hours:.0f} h: {per_variant / 1e6:.2f} MB per variant and partition"
    )


if __name__ == "__main__":
    main()
