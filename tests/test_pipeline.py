"""The live pipeline on the embedded store agrees with `evaluator replay` on the same events."""

from __future__ import annotations

import numpy as np
import pytest

from evaluator.config import load_settings
from evaluator.pipeline import Pipeline
from evaluator.stores.memory import MemoryStore
from tests.eventgen import EventSet, generate
from tests.livecheck import FakeClock, compare_with_replay, expected_late, feed, sentinel


@pytest.mark.parametrize("seed", [21, 22])
def test_live_pipeline_equals_replay(tmp_path, make_store, seed: int) -> None:
    settings = load_settings(environ={}, overrides={"event_time": {"max_out_of_orderness": "5s"}})
    store = make_store(settings.layout())
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


def test_redelivery_and_duplicate_commits_change_nothing(make_store) -> None:
    settings = load_settings(environ={})
    events = generate(3)
    events.impressions.append(sentinel(events))
    once = make_store(settings.layout())
    feed(Pipeline(once, settings, clock_ms=FakeClock()), events, 3)
    twice = make_store(settings.layout())
    pipeline = Pipeline(twice, settings, clock_ms=FakeClock())
    doubled = EventSet(events.impressions * 2, events.interactions * 2)
    feed(pipeline, doubled, 3)
    for window in settings.layout().windows_ms:
        a, b = once.blocks(window), twice.blocks(window)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], atol=1e-9)


def test_watermark_idle_partitions_and_reassignment() -> None:
    from evaluator.stores.base import PartitionProgress

    settings = load_settings(
        environ={}, overrides={"event_time": {"idle_timeout": "30s", "max_out_of_orderness": "5s"}}
    )
    clock = FakeClock()
    store = MemoryStore(settings.layout())
    pipeline = Pipeline(store, settings, clock_ms=clock)
    assert pipeline.watermark() is None
    store.record_progress(
        {
            "impressions:0": PartitionProgress(1_000_000, 0),
            "impressions:1": PartitionProgress(9_000_000, 0),
        }
    )
    assert pipeline.watermark() == 1_000_000 - 5_000  # both active: the slowest holds it
    clock.now = 31_000
    assert pipeline.watermark() == 9_000_000 - 5_000  # all idle: the furthest seen
    pipeline.register(["impressions:0", "impressions:1"])  # a new owner: active again
    assert pipeline.watermark() == 1_000_000 - 5_000
