"""``evaluator demo`` without services: simulated traffic through the live pipeline on the
embedded store recovers the simulator's ground truth."""

from __future__ import annotations

import urllib.request

import pytest

from evaluator.adapters.memory import MemoryStore
from evaluator.app.demo import demo_tree, run_demo
from evaluator.config import load_settings
from tests.live import has_sample, running_demo, wait_until

DEMO_REQUESTS = 12_000
"""About 48,000 events; at least 4,000 requests per variant are finalised."""
TOLERANCE = 0.02


def _means(store: MemoryStore, settings) -> dict[str, dict[str, float]]:
    """Mean raw and adjusted nDCG@10 per variant over every bucket of the longest window."""
    layout = settings.layout()
    columns = layout.columns()
    raw, adj = 2 + columns.index(("ndcg", 10)), 2 + columns.index(("ndcg_adjusted", 10))
    sums: dict[str, list[float]] = {}
    for (_, variant), block in store.blocks(max(layout.windows_ms)).items():
        acc = sums.setdefault(variant, [0.0, 0.0, 0.0])
        acc[0] += block[..., 0].sum()
        acc[1] += block[..., raw].sum()
        acc[2] += block[..., adj].sum()
    return {v: {"n": n, "raw": r / n, "adjusted": a / n} for v, (n, r, a) in sums.items()}


def test_demo_pipeline_recovers_the_ground_truth() -> None:
    settings = load_settings(environ={}, overrides=demo_tree({"http": {"port": 0}}))
    store = MemoryStore(settings.layout(1))
    # no pacing; 10 requests per second of event time, so most requests finalise
    sim = run_demo(settings, requests=DEMO_REQUESTS, requests_per_s=1e9, speed=1e8, store=store)
    truth = sim.truth.as_dict()["ndcg"]
    got = _means(store, settings)
    assert set(got) == {"control", "treatment"}
    for variant, values in got.items():
        assert values["n"] >= 4_000
        assert values["raw"] == pytest.approx(truth[variant]["@10"]["raw"], abs=TOLERANCE)
    assert got["treatment"]["raw"] > got["control"]["raw"]
    # the estimated curve took over once there were enough clicks
    assert got["control"]["adjusted"] < got["control"]["raw"] - 0.01


def test_demo_serves_metrics_and_the_page_while_running() -> None:
    with running_demo(requests_per_s=500.0) as base:

        def scrape() -> str:
            try:
                return urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
            except OSError:  # not listening yet
                return ""

        seen: list[str] = []

        def has_numbers() -> bool:
            seen.append(scrape())
            return has_sample(seen[-1], "recsys_eval_ndcg", variant="treatment")

        wait_until(has_numbers, 30, "the demo shows live numbers (README: within 30 s)")
        assert has_sample(seen[-1], "recsys_eval_requests", variant="control")
        page = urllib.request.urlopen(base + "/", timeout=5).read().decode()
        body = page.split("<body>")[1]
        assert "/dashboard.js" in body and "https://" not in page  # nothing from a CDN
