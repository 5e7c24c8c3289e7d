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
