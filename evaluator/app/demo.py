"""``evaluator demo``: simulator -> the live pipeline -> embedded store -> /metrics + dashboard.

One command, no services: simulated traffic runs through the same
:class:`evaluator.engine.tasks.Tasks` as ``evaluator run``, with the embedded
store (``--redis`` uses Redis instead; ``--kafka`` produces the traffic to
Kafka and consumes it back with ``evaluator run``'s loop). Event time runs
``speed`` times faster than the wall clock, so requests finalise seconds after
they are shown although the attribution window is minutes long.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from evaluator.adapters.memory import MemoryStore
from evaluator.app.serving import serve_metrics
from evaluator.app.simulate import RateLimiter
from evaluator.config import Settings, merge
from evaluator.config.plain import tasks_config
from evaluator.core.simulator import SimulationConfig, Simulator
from evaluator.engine.batches import PartitionBatch
from evaluator.engine.ports import StateStore
from evaluator.engine.tasks import Tasks

log = logging.getLogger("evaluator.demo")

DEMO_OVERRIDES: dict[str, Any] = {
    "join": {"attribution_window": "3m"},
    "event_time": {"allowed_lateness": "10s", "idle_timeout": "5s", "max_future": 0},
    "windows": {"sizes": ["5m", "30m", "2h"]},
    "propensity": {"model": "estimated", "estimator": "em"},
    "http": {"refresh_interval": "1s", "host": "127.0.0.1", "port": 8000},
    "ab": {"tuning": 2000.0},
    "redis": {"checkpoint_interval": 0},
}
"""Demo defaults (event time): a short attribution window and windows that fill quickly;
no future-timestamp check, since simulated event time runs ahead of the wall clock;
a checkpoint after every chunk, because the demo's event time runs many times faster
than the wall clock (a second's interval would be minutes of its data, and the
estimated propensity curve, fed by the stored counters, would take over late). A
configuration file, the environment and flags still override them."""


DEMO_USERS = 20_000
"""Simulated users: A/B inference starts once each arm has ``ab.min_users`` (1,000)."""

DEMO_PARTITIONS = 1
"""The simulator's traffic is one partition of the engine."""


def build_memory_store(settings: Settings, partitions: int = DEMO_PARTITIONS) -> MemoryStore:
    """The embedded store, configured from the settings like the Redis one."""
    return MemoryStore(
        settings.layout(partitions), propensity_history_ms=settings.propensity.history_ms()
    )


def demo_tree(user_tree: dict[str, Any]) -> dict[str, Any]:
    return merge(DEMO_OVERRIDES, user_tree)


def sim_config(
    settings: Settings, seed: int, requests_per_s: float, speed: float, interleave: bool = False
) -> SimulationConfig:
    """Simulated traffic whose event time starts now and runs ``speed`` x the wall clock
    (``interleave``: every list a team draft of the two variants' rankings)."""
    return SimulationConfig(
        interleave=interleave,
        seed=seed,
        requests_per_second=requests_per_s / speed,
        start_ms=time.time_ns() // 1_000_000,
        ks=tuple(settings.metrics.k),
        gain=settings.metrics.gain,
        interaction_delay_ms=40_000,
        late_fraction=0.002,
        # enough users that both arms pass ab.min_users within the first minute
        users=DEMO_USERS,
    )


def feed(
    tasks: Tasks,
    simulator: Simulator,
    requests_per_s: float,
    stop: threading.Event,
    requests: int | None = None,
) -> None:
    """Simulated chunks through the engine, paced to ``requests_per_s`` in wall time.
    When the simulator is done, its inputs are at their end: they go idle and the
    partition finalises what its event time allows."""
    limiter = RateLimiter(requests_per_s)
    offsets = {"impressions": 0, "interactions": 0}
    for chunk in simulator.chunks(requests, chunk=64):
        batches = []
        for kind in ("impressions", "interactions"):
            payloads = [e.payload for e in chunk if e.kind == kind]
            if payloads:
                start = offsets[kind]
                offsets[kind] += len(payloads)
                offs = range(start, start + len(payloads))
                batches.append(PartitionBatch(kind, f"{kind}:0", payloads, offs))
        tasks.apply(batches, {})
        if stop.wait(limiter.delay(64)):
            return

    def ended() -> dict[str, int]:
        now = tasks.clock_ms()
        return {f"{kind}:0": now for kind in ("impressions", "interactions")}

    tasks.apply([], ended())
    idle_s = tasks.config.idle_timeout_ms / 1000.0
    if not stop.wait(idle_s):
        tasks.apply([], ended())


def run_demo(
    settings: Settings,
    *,
    seed: int = 0,
    requests_per_s: float = 300.0,
    speed: float = 20.0,
    requests: int | None = None,
    store: StateStore | None = None,
    stop: threading.Event | None = None,
    interleave: bool = False,
) -> Simulator:
    """Run until stopped (or ``requests`` are done); returns the simulator (ground truth)."""
    stop = stop or threading.Event()
    config = sim_config(settings, seed, requests_per_s, speed, interleave)
    simulator = Simulator(config)
    store = store or build_memory_store(settings)
    tasks = Tasks(store, tasks_config(settings, DEMO_PARTITIONS))
    tasks.assign([0])
    server = serve_metrics(
        settings,
        store,
        tasks,
        alive=lambda: True,
        ready=lambda: (True, "ready: demo"),
        truth=simulator.truth.as_dict,
    )
    if server is not None:
        host, port = server.server_address[:2]
        log.info("dashboard: http://%s:%d/  (metrics: /metrics)", host, port)
    try:
        feed(tasks, simulator, requests_per_s, stop, requests)
    finally:
        if server is not None:
            server.shutdown()
        store.close()
    return simulator
