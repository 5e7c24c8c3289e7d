"""Compare live window aggregates with `evaluator replay` on the same events."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evaluator.app.replay import evaluate_files, load_events, replay_history
from evaluator.config import Settings
from evaluator.core.ab.interleaving import is_pair, pair_key
from evaluator.core.batch import attribute, dedupe_impressions
from evaluator.core.batch import observations as observations_of
from evaluator.core.propensity.estimation import increments
from evaluator.core.provisional import PROVISIONAL
from evaluator.core.rows import INTERLEAVING
from evaluator.engine.batches import PartitionBatch
from evaluator.engine.commit_payload import USERS
from evaluator.engine.partitioner import PartitionOf
from evaluator.engine.ports import StateStore
from evaluator.engine.tasks import Tasks
from tests.eventgen import EventSet

SENTINEL_VARIANT = "zz-sentinel"


class FakeClock:
    """Wall clock under test control: processing time decides idleness and checkpoint
    intervals, and which events come from the future (``event_time.max_future``)."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def partition_of(user_id: str, partitions: int) -> int:
    """The partition a user's events go to (as a Kafka producer keyed by user id puts
    them, with the default partitioner)."""
    return PartitionOf("murmur2", partitions)([user_id])[0]


def feed(
    tasks: Tasks,
    events: EventSet,
    seed: int,
    *,
    batch: int = 64,
    end_ms: int | None = None,
    keyed: bool = True,
    follow: bool = True,
) -> dict[str, int]:
    """Deliver events in event-time order with small jitter, each user's to their
    partition, the wall clock following the data as when consuming live traffic, then
    let every input go idle with the wall clock at ``end_ms`` (default: a day after the
    last event, so every request is final). ``keyed=False``: round robin over the
    partitions, as a producer that does not key by user.
    ``follow=False``: the clock moves 10 ms a poll instead (a backlog consumed
    faster than its data's time: polls accumulate between checkpoints; the events
    are then mostly ahead of that clock, so ``event_time.max_future`` must be 0).

    Returns the watermark of its partition in force when each interaction was delivered.
    """
    rng = random.Random(seed)
    n = tasks.partitions
    stream = [("impressions", e) for e in events.impressions] + [
        ("interactions", e) for e in events.interactions
    ]
    stream.sort(key=lambda ke: ke[1]["timestamp"] + rng.randrange(0, 3_000))
    seen_at: dict[str, int] = {}
    offsets: dict[str, int] = defaultdict(int)
    clock = tasks.clock_ms
    for start in range(0, len(stream), batch):
        chunk = stream[start : start + batch]
        parts: dict[str, list[bytes]] = defaultdict(list)
        for i, (kind, e) in enumerate(chunk):
            p = partition_of(e.get("user_id", ""), n) if keyed else (start + i) % n
            if kind == "interactions":
                mark = tasks.owned[p].engine.watermark_ms
                seen_at.setdefault(e["event_id"], -(2**62) if mark is None else mark)
            parts[f"{kind}:{p}"].append(json.dumps(e).encode())
        batches = []
        for name, payloads in parts.items():
            kind = name.split(":")[0]
            first = offsets[name]
            offsets[name] += len(payloads)
            batches.append(
                PartitionBatch(kind, name, payloads, range(first, first + len(payloads)))  # type: ignore[arg-type]
            )
        newest = max(e["timestamp"] for _, e in chunk) if follow else 0
        clock.now = max(clock.now + 10, newest)  # type: ignore[attr-defined]
        tasks.apply(batches, {})
    # the stream goes quiet: every input is at its end for idle_timeout
    last = max(e["timestamp"] for _, e in stream)
    clock.now = end_ms if end_ms is not None else last + 86_400_000  # type: ignore[attr-defined]
    names = [f"{kind}:{p}" for kind in ("impressions", "interactions") for p in range(n)]
    tasks.apply([], {})  # what the last batches forwarded
    tasks.apply([], dict.fromkeys(names, clock.now))  # type: ignore[attr-defined]
    clock.now += tasks.config.idle_timeout_ms  # type: ignore[attr-defined]
    tasks.apply([], dict.fromkeys(names, clock.now))  # type: ignore[attr-defined]
    tasks.settle()  # checkpoints written behind are in the store
    return seen_at


def sentinel(events: EventSet, after_ms: int = 2 * 86_400_000) -> dict[str, Any]:
    """A final impression far in the future: it moves the watermark past every deadline."""
    last = max(e["timestamp"] for e in events.impressions + events.interactions)
    return {
        "event_id": "sentinel",
        "request_id": "sentinel",
        "user_id": "sentinel",
        "variant": SENTINEL_VARIANT,
        "timestamp": last + after_ms,
        "items": ["s"],
    }


def expected_late(events: EventSet, settings: Settings, seen_at: dict[str, int]) -> int:
    """Distinct request-id interactions delivered when the watermark had already passed
    their request's finalisation deadline (``seen_at``: watermark at delivery)."""
    config = settings.finalise_config()
    shown = {}
    for e in events.impressions:
        shown.setdefault(e["request_id"], e["timestamp"])
    late = {
        it["event_id"]
        for it in events.interactions
        if it.get("request_id") in shown
        and seen_at[it["event_id"]] >= config.deadline(shown[it["request_id"]])
    }
    return len(late)


def live_totals(store: StateStore, window_ms: int) -> dict[str, np.ndarray]:
    """Per variant: the (2 cohorts, row) sums over every bucket and user bucket of a window."""
    totals: dict[str, np.ndarray] = {}
    for (_, variant), block in store.blocks(window_ms).items():
        summed = block.sum(axis=1)
        totals[variant] = totals.get(variant, 0) + summed
    return totals


def compare_with_replay(
    store: StateStore, events: EventSet, settings: Settings, directory: Path
) -> dict[str, Any]:
    imp, inter = events.write(directory)
    report = evaluate_files(imp, inter, settings, progress=False)
    if settings.propensity.collect:
        # the estimators' counters: each finalised request counted exactly once
        expected = expected_propensity_counts(imp, inter, settings)
        assert expected and store.propensity_counts() == expected
    totals = live_totals(store, max(settings.layout().windows_ms))
    compare_totals(totals, report, settings)
    compare_coverage(store, events, settings, report)
    compare_experiment(store, events, settings, report)
    compare_history(store, imp, inter, settings)
    return report


def compare_history(store: StateStore, imp: Path, inter: Path, settings: Settings) -> None:
    """The regression detector's history, final and provisional slots, is exactly what
    replay computes from the same events: every request counted once, in its slot,
    scored early with the interactions of its first ``regression.provisional_age``."""
    stored, replayed = store.history(0), replay_history(imp, inter, settings)
    if settings.provisional().lead:
        assert any(name.startswith(PROVISIONAL) for _, name in stored)
    assert stored.keys() == replayed.keys()
    for key, array in replayed.items():
        assert np.array_equal(stored[key], array), key


def compare_experiment(
    store: StateStore, events: EventSet, settings: Settings, report: dict[str, Any]
) -> None:
    """The default experiment's cumulative statistics hold every finalised request
    (the data spans less than the longest window, so replay's totals are theirs too),
    every user with an impression is counted exactly once, and each ranker pair's
    interleaving outcomes are replay's."""
    blocks = store.experiment_blocks("default")
    pairs = {k: b for k, b in blocks.items() if is_pair(k)}
    cumulative = {v: b.sum(axis=1) for v, b in blocks.items() if v not in pairs}
    compare_totals(cumulative, report, settings)
    replayed = report["ab"]["default"]["interleaving"]
    assert len(replayed) == len(pairs)
    assert replayed or not any("teams" in e for e in events.impressions)
    for pair in replayed:
        block = pairs[pair_key(*pair["rankers"])]
        total, requests, _ = (block[..., store.layout.schema.index(c)].sum() for c in INTERLEAVING)
        assert requests == pair["requests"]
        assert total / requests == pytest.approx(pair["preference"], rel=1e-12)
    users = {imp["user_id"] for imp in events.impressions}
    assert sum(store.exposures("default").values()) == len(users)


def compare_totals(
    totals: dict[str, np.ndarray], report: dict[str, Any], settings: Settings
) -> None:
    """Per variant (2 cohorts, row) sums equal replay's requests, engaged and means."""
    columns = settings.layout().columns()
    expected = {v for v in report["variants"] if v != SENTINEL_VARIANT}
    assert set(totals) == expected
    for variant in expected:
        want = report["variants"][variant]
        for label, got in (
            ("all", totals[variant].sum(axis=0)),
            ("cold_start", totals[variant][0]),
            ("established", totals[variant][1]),
        ):
            block = want if label == "all" else want["cohorts"][label]
            assert got[0] == block["requests"], (variant, label)
            assert got[1] == block["engaged"], (variant, label)
            for j, (metric, k) in enumerate(columns):
                mean = got[2 + j] / got[0] if got[0] else None
                assert mean == pytest.approx(block[metric][str(k)], abs=1e-9), (
                    variant,
                    label,
                    metric,
                    k,
                )


def compare_coverage(
    store: StateStore, events: EventSet, settings: Settings, report: dict[str, Any]
) -> None:
    """Each variant's distinct top-K items and distinct users over the longest window
    (the union of the buckets the requests' deadlines fall in) equal replay's, within
    the sketches' error: none lost to a crash or restart, none missing from a second
    instance."""
    layout, config = settings.layout(), settings.finalise_config()
    window = max(layout.windows_ms)
    deadlines = [
        config.deadline(e["timestamp"])
        for e in events.impressions
        if e["variant"] != SENTINEL_VARIANT
    ]
    starts = sorted(set(layout.bucket_start(window, np.array(deadlines)).tolist()))
    variants = sorted({v for v in report["variants"] if v != SENTINEL_VARIANT})
    counts, _ = store.distinct_items(window, starts, variants)
    for variant in variants:
        block = report["variants"][variant]
        for k in layout.ks:
            want = block["coverage"][str(k)] * block["catalog_size"]
            got = counts[(variant, k)]
            assert got == pytest.approx(want, rel=0.02, abs=1), (variant, k)
        assert counts[(variant, USERS)] == pytest.approx(block["users"], rel=0.02, abs=1)


def expected_propensity_counts(imp: Path, inter: Path, settings: Settings) -> dict[str, int]:
    """Propensity counters replay derives from the same events (without the sentinel)."""
    imps, ints, _ = load_events(imp, inter, settings, progress=False)
    requests = dedupe_impressions(imps)
    attribution = attribute(requests, ints, settings.join.rules())
    observations = [
        obs
        for obs, event in zip(observations_of(requests, attribution), requests.events, strict=True)
        if event.variant != SENTINEL_VARIANT
    ]
    return dict(increments(observations, settings.propensity.positions))
