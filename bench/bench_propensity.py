"""Cost of propensity estimation: live pipeline events/s with and without it.

The same simulated traffic (``evaluator simulate``'s generator) is processed by
the live path (:class:`evaluator.engine.tasks.Tasks`, one partition) on the embedded
store, once with ``propensity.estimator = "none"`` and once with ``"em"`` plus
``model = "estimated"`` (counters at every finalisation and a curve per window
bucket). Also times one EM fit on the
accumulated counters. Run: ``.venv/bin/python bench/bench_propensity.py``.
"""

from __future__ import annotations

import time

from _common import machine, median_rate

from evaluator.adapters.memory import MemoryStore
from evaluator.config import load_settings
from evaluator.config.plain import tasks_config
from evaluator.core.propensity.estimation import estimate
from evaluator.core.simulator import SimulationConfig, Simulator
from evaluator.engine.batches import PartitionBatch
from evaluator.engine.tasks import Tasks

REQUESTS = 20_000


def batches() -> list[list[PartitionBatch]]:
    sim = Simulator(SimulationConfig(seed=2, requests_per_second=2))
    out = []
    offsets = {"impressions": 0, "interactions": 0}
    for chunk in sim.chunks(REQUESTS, chunk=1000):
        polled = []
        for kind in ("impressions", "interactions"):
            payloads = [e.payload for e in chunk if e.kind == kind]
            first = offsets[kind]
            offsets[kind] += len(payloads)
            polled.append(PartitionBatch(kind, f"{kind}:0", payloads, range(first, offsets[kind])))
        out.append(polled)
    return out


def run(polled: list[list[PartitionBatch]], overrides: dict[str, object]) -> MemoryStore:
    settings = load_settings(environ={}, overrides=overrides)
    store = MemoryStore(settings.layout(1))
    clock = iter(range(0, 10**12, 1000))
    tasks = Tasks(store, tasks_config(settings, 1), clock_ms=lambda: next(clock))
    tasks.assign([0])
    for polled_batch in polled:
        tasks.apply(polled_batch, {})
    return store


def main() -> None:
    polled = batches()
    events = sum(len(b.payloads) for p in polled for b in p)
    off: dict[str, object] = {}
    on = {"propensity": {"estimator": "em", "model": "estimated"}}
    base, base_spread = median_rate(lambda: run(polled, off), events, repeats=3)
    with_est, est_spread = median_rate(lambda: run(polled, on), events, repeats=3)
    store = run(polled, on)
    counts = store.propensity_counts()
    started = time.perf_counter()
    estimate(counts, "em", 10)
    fit_s = time.perf_counter() - started
    print(f"machine: {machine()}")
    print(f"events: {events} ({REQUESTS} requests), embedded store, median of 3")
    print(f"without estimation: {base:,.0f} events/s (spread {base_spread:.2f})")
    print(f"with EM estimation: {with_est:,.0f} events/s (spread {est_spread:.2f})")
    print(f"ratio with/without: {with_est / base:.2f}")
    print(f"requests finalised: {store.counters().get('finalised', 0)}")
    print(f"one EM fit on {len(counts)} counters: {fit_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
