"""The live pipeline on the embedded store agrees with `evaluator replay` on the same events."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from evaluator.config import load_settings
from evaluator.pipeline import PartitionBatch, Pipeline
from evaluator.stores.memory import MemoryStore
from tests.eventgen import EventSet, generate
from tests.livecheck import compare_with_replay, expected_late, sentinel


class FakeClock:
    """Wall clock under test control (processing time only affects idleness)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def feed(pipeline: Pipeline, events: EventSet, seed: int, batch: int = 64) -> dict[str, int]:
    """Deliver events in event-time order with small jitter, round-robin over 2 partitions.

    Returns the watermark in force when each interaction was delivered.
    """
    rng = random.Random(seed)
    stream = [("impressions", e) for e in events.impressions] + [
        ("interactions", e) for e in events.interactions
    ]
    stream.sort(key=lambda ke: ke[1]["timestamp"] + rng.randrange(0, 3_000))
    seen_at: dict[str, int] = {}
    for start in range(0, len(stream), batch):
        chunk = stream[start : start + batch]
        watermark = pipeline.watermark()
        for kind, e in chunk:
            if kind == "interactions":
                seen_at.setdefault(e["event_id"], -(2**62) if watermark is None else watermark)
        parts = []
        for kind in ("impressions", "interactions"):
            for p in range(2):
                payloads = [
                    json.dumps(e).encode()
                    for i, (k, e) in enumerate(chunk)
                    if k == kind and i % 2 == p
                ]
                if payloads:
                    parts.append(PartitionBatch(kind, f"{kind}:{p}", payloads))
        pipeline.process(parts)
        pipeline.clock_ms.now += 10  # type: ignore[attr-defined]
    # the stream goes quiet: once every partition is idle the watermark reaches the end
    pipeline.clock_ms.now += pipeline.idle_ms  # type: ignore[attr-defined]
    pipeline.finalise_due()
    return seen_at


@pytest.mark.parametrize("seed", [21, 22])
def test_live_pipeline_equals_replay(tmp_path, seed: int) -> None:
    settings = load_settings(environ={}, overrides={"event_time": {"max_out_of_orderness": "5s"}})
    store = MemoryStore(settings.layout())
    clock = FakeClock()
    pipeline = Pipeline(store, settings, clock_ms=clock)
    events = generate(seed)
    events.impressions.append(sentinel(events))
    seen_at = feed(pipeline, events, seed)
    compare_with_replay(store, events, settings, tmp_path)
    # Interactions naming a request whose deadline the watermark had passed are late;
    # replay finds them outside the attribution window, so the aggregates agree regardless.
    assert pipeline.stats.late == expected_late(events, settings, seen_at)
    assert pipeline.stats.late > 0
    assert store.counters()["late"] == pipeline.stats.late


def test_redelivery_and_duplicate_commits_change_nothing(tmp_path) -> None:
    settings = load_settings(environ={})
    events = generate(3)
    events.impressions.append(sentinel(events))
    once = MemoryStore(settings.layout())
    feed(Pipeline(once, settings, clock_ms=FakeClock()), events, 3)
    twice = MemoryStore(settings.layout())
    pipeline = Pipeline(twice, settings, clock_ms=FakeClock())
    doubled = EventSet(events.impressions * 2, events.interactions * 2)
    feed(pipeline, doubled, 3)
    for window in settings.layout().windows_ms:
        a, b = once.blocks(window), twice.blocks(window)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], atol=1e-9)
