"""Standard errors of the window means (`recsys_eval_ndcg_stderr`): the delta method
over user buckets against the spread of the means of simulated windows, and the
exported series against a direct computation from the stored blocks and against
replay's report."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings
from evaluator.readout.model import group_view
from tests.absim import BUCKETS, Traffic, users_of
from tests.eventgen import EventSet
from tests.test_ab_exported import HOUR, T0, deliver, hourly_traffic, live, pick

DAY_MS = 86_400_000


def test_the_standard_error_is_the_spread_of_window_means() -> None:
    """300 simulated windows of the same user population (overdispersed requests per
    user, per-user engagement and nDCG level: one user's requests are correlated):
    the median standard error is within 10% of the standard deviation of the window
    means, and mean ± 1.96 se holds the population's mean in about 95% of windows."""
    layout = load_settings(environ={}).layout()
    schema = layout.schema
    count, value = schema.index("count"), schema.value("ndcg", 10)
    means, errors = [], []
    rng = np.random.default_rng(8)
    for _ in range(300):
        _, bucket, requests, _, ndcg = users_of(rng, Traffic(users=3_000))
        rows = np.zeros((BUCKETS, schema.width))
        rows[:, count] = np.bincount(bucket, requests, BUCKETS)
        rows[:, value] = np.bincount(bucket, ndcg, BUCKETS)
        view = group_view(rows, schema, (10,), "count")
        means.append(view.means[("ndcg", 10)])
        errors.append(view.stderr[("ndcg", 10)])
    spread = float(np.std(means, ddof=1))
    assert 0.9 <= np.median(errors) / spread <= 1.1
    truth = float(np.mean(means))  # the population's mean, to within spread / sqrt(300)
    covered = np.mean([abs(m - truth) <= 1.96 * e for m, e in zip(means, errors, strict=True)])
    assert 0.92 <= covered <= 0.98


def test_the_exported_standard_error_is_the_stored_blocks_delta_method(tmp_path) -> None:
    settings = load_settings(
        environ={},
        overrides={"join": {"attribution_window": "5m"}, "kafka": {"partitioner": "trust"}},
    )
    tasks, clock, registry = live(settings)
    offsets = {"impressions": 0, "interactions": 0}
    hours = hourly_traffic(random.Random(4), hours=12, users=1_500)
    # a later impression of another variant moves the data's time past every deadline,
    # so the live windows read every request of A and B, as replay does
    later = {"event_id": "s", "request_id": "s", "user_id": "s", "variant": "Z"}
    hours.append([json.dumps(later | {"timestamp": T0 + 14 * HOUR, "items": ["p1"]}).encode()])
    for hour in hours:
        deliver(tasks, clock, hour, offsets)
    for _ in range(3):  # every request final: the inputs idle at their ends
        clock.now += 3_600_000
        tasks.apply([], {"impressions:0": clock.now, "interactions:0": clock.now})
    assert tasks.stats.finalised == sum(b'"items"' in raw for hour in hours for raw in hour)
    found = scrape_all(registry)
    schema = tasks.store.layout.schema
    count, value = schema.index("count"), schema.value("ndcg", 10)
    for variant in "AB":
        rows = sum(
            block.sum(axis=0)  # cohorts: (user bucket, row)
            for (_, v), block in tasks.store.blocks(DAY_MS).items()
            if v == variant
        )
        s, n = rows[:, value], rows[:, count]
        used = n > 0
        b = int(used.sum())
        mean = s.sum() / n.sum()
        variance = ((s - mean * n)[used] ** 2).sum() / (b * (b - 1) * (n.sum() / b) ** 2)
        labels = {"variant": variant, "k": "10", "window": "24h", "adjusted": "false"}
        got = pick(found, "recsys_eval_ndcg_stderr", cohort="all", **labels)
        assert got == pytest.approx(np.sqrt(variance), rel=1e-9)
        assert pick(found, "recsys_eval_ndcg", cohort="all", **labels) == pytest.approx(mean)
        # replay of the same events: the same user buckets with one partition
        want = replayed(hours, settings, tmp_path)["variants"][variant]["stderr"]["ndcg"]["10"]
        assert got == pytest.approx(want, rel=1e-9)


def replayed(hours: list[list[bytes]], settings, directory) -> dict:
    events = [json.loads(raw) for hour in hours for raw in hour]
    files = EventSet(
        [e for e in events if "items" in e], [e for e in events if "items" not in e]
    ).write(directory)
    return evaluate_files(*files, settings, progress=False)


def scrape_all(registry) -> dict:
    """Every sample of the window families (the A/B test module's scrape keeps A/B ones)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("recsys_eval_ndcg")
    }
