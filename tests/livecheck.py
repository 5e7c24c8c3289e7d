"""Compare live window aggregates with `evaluator replay` on the same events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evaluator.commands.replay import evaluate_files
from evaluator.config import Settings
from evaluator.stores.base import StateStore
from tests.eventgen import EventSet

SENTINEL_VARIANT = "zz-sentinel"


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
    layout = settings.layout()
    columns = layout.columns()
    totals = live_totals(store, max(layout.windows_ms))
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
    return report
