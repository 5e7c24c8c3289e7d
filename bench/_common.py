"""Shared helpers for benchmarks: repeated timing with medians, and machine description."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable


def median_rate(work: Callable[[], object], items: int, repeats: int = 5) -> tuple[float, float]:
    """Median and spread (max/min) of items per second over ``repeats`` runs."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        rates.append(items / (time.perf_counter() - start))
    return statistics.median(rates), max(rates) / min(rates)


def machine() -> str:
    cpu = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


T0 = 1_700_000_000_000


def synthetic_events(
    requests: int,
    *,
    seed: int = 0,
    spacing_ms: int = 50,
    per_request: tuple[int, ...] = (0, 1, 1, 2, 3),
    types: tuple[str, ...] = ("click", "click", "add_to_cart", "purchase"),
    uuid_ids: bool = False,
) -> tuple[list[bytes], list[bytes]]:
    """Impressions of 20 items over 2 variants and users, and position-biased interactions
    (70% naming their request), as JSON payloads; ``uuid_ids``: request ids as most
    producers send them, ``req-`` and a canonical UUID (else ``r<n>``), the events
    otherwise the same."""
    import json
    import random
    import uuid

    rng = random.Random(seed)
    imps, ints = [], []
    for r in range(requests):
        ts = T0 + r * spacing_ms
        rid = f"req-{uuid.UUID(int=(r * 0x9E3779B97F4A7C15F39CC0605CEDC835) % 2**128)}"
        rid = rid if uuid_ids else f"r{r}"
        items = list(dict.fromkeys(f"p{rng.randrange(50_000)}" for _ in range(20)))
        user = f"u{rng.randrange(max(1, requests // 4))}"
        imps.append(
            json.dumps(
                {
                    "event_id": f"i{r}",
                    "request_id": rid,
                    "user_id": user,
                    "variant": "AB"[r % 2],
                    "timestamp": ts,
                    "items": items,
                }
            ).encode()
        )
        for n in range(rng.choice(per_request)):
            event = {
                "event_id": f"e{r}-{n}",
                "user_id": user,
                "item_id": items[min(int(rng.expovariate(0.3)), len(items) - 1)],
                "type": rng.choice(types),
                "timestamp": ts + rng.randrange(1_000, 600_000),
            }
            if rng.random() < 0.7:
                event["request_id"] = rid
            ints.append(json.dumps(event).encode())
    return imps, ints
