"""CUPED through the live engine and the registered collector: user-randomised A/A
traffic whose users are active for two weeks before the experiment starts, fed through
the partition engine on the embedded store and on Redis, four hours at a time.

Checked: each arm's stored covariate is exactly the reference's (per user, the clicks on
the 14 whole days before the day of their first exposure, computed here from the
events), the exported CUPED interval is narrower than the unadjusted one and never
flags this A/A experiment, and a new owner restores every user's activity.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict

import numpy as np
import pytest

from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings
from evaluator.config.plain import readout_config, tasks_config
from evaluator.core.rows import COVARIATE
from evaluator.engine.tasks import Tasks
from evaluator.readout.live import LiveReader
from tests.eventgen import EventSet
from tests.test_ab_exported import HOUR, T0, deliver, hourly_traffic, live, pick, scrape

DAY = 24 * HOUR
START = T0 + 15 * DAY + 12 * HOUR  # users active that morning: not counted
STEP = 4 * HOUR


def reference(steps: list[list[bytes]]) -> dict[str, tuple[float, float]]:
    """Per variant: (Σ covariate, users with one) over the users exposed from START."""
    clicks: dict[str, list[int]] = defaultdict(list)
    exposed: dict[str, tuple[str, int]] = {}
    for step in steps:
        for raw in step:
            event = json.loads(raw)
            if "items" not in event:
                clicks[event["user_id"]].append(event["timestamp"] // DAY)
            elif event["timestamp"] >= START and event["user_id"] not in exposed:
                exposed[event["user_id"]] = (event["variant"], event["timestamp"] // DAY)
    out = {"A": [0.0, 0.0], "B": [0.0, 0.0]}
    for user, (variant, day) in exposed.items():
        x = sum(day - 14 <= d < day for d in clicks[user])
        if x:
            out[variant][0] += x
            out[variant][1] += 1
    return {v: (s, n) for v, (s, n) in out.items()}


SETTINGS = {
    "ab": {"min_users": 300, "experiments": {"exp": {"start": START}}},
    "join": {"attribution_window": "5m"},
    "kafka": {"partitioner": "trust"},
}
LABELS = {"experiment": "exp", "variant": "B", "k": "10", "adjusted": "false"}


@pytest.mark.parametrize("make_store", ["memory", "redis"], indirect=True)  # Cluster: contract
def test_cuped_covariates_and_series_through_the_live_engine(tmp_path, make_store) -> None:
    settings = load_settings(environ={}, overrides=SETTINGS)
    store = make_store(settings.layout(1))
    tasks, clock, registry = live(settings, store)
    steps = hourly_traffic(
        random.Random(5), hours=30 * 6, users=2_000, step_ms=STEP, per_step=(90, 130)
    )
    offsets = {"impressions": 0, "interactions": 0}
    looks = 0
    for n, step in enumerate(steps):
        deliver(tasks, clock, step, offsets)
        if n % 3:
            continue
        found = scrape(registry)
        lower = pick(found, "recsys_eval_ab_cuped_ndcg_diff_lower", **LABELS)
        if lower is not None:
            upper = pick(found, "recsys_eval_ab_cuped_ndcg_diff_upper", **LABELS)
            assert upper is not None and lower <= 0.0 <= upper  # A/A: never flagged
            looks += 1
    assert looks >= 20
    # the stored covariate is exactly the reference's, per arm
    blocks = store.experiment_blocks("exp")
    x, users = (store.layout.schema.index(n) for n in COVARIATE)
    for variant, (total, covered) in reference(steps).items():
        assert covered > 500  # most users were active before their exposure
        assert blocks[variant][..., x].sum() == total
        assert blocks[variant][..., users].sum() == covered
    gained(scrape(registry))
    # replay of the same events reads the same CUPED figures (once every request is
    # final live too: the wall clock runs on past the idle timeout)
    for _ in range(3):
        clock.now += DAY
        tasks.apply([], {"impressions:0": clock.now, "interactions:0": clock.now})
    tasks.settle()
    assert tasks.stats.finalised == sum(b'"items"' in raw for step in steps for raw in step)
    same_as_replay(store, settings, steps, tmp_path)
    # a new owner restores every user's activity
    again = Tasks(store, tasks_config(settings, 1), clock_ms=clock)
    again.assign([0])
    before = tasks.owned[0].engine.state.users
    after = again.owned[0].engine.state.users
    active = {u: s.days for u, s in before.items() if s.days}
    assert active and active == {u: s.days for u, s in after.items() if s.days}
    assert np.mean([len(days) // 2 for days in active.values()]) > 3


def gained(found: dict) -> None:
    """What the covariate gains, as exported: narrower, by the variance it removed."""
    reduction = pick(found, "recsys_eval_ab_cuped_variance_reduction", **LABELS)
    width = {
        name: pick(found, f"recsys_eval_ab_{name}ndcg_diff_upper", **LABELS)
        - pick(found, f"recsys_eval_ab_{name}ndcg_diff_lower", **LABELS)
        for name in ("", "cuped_")
    }
    assert reduction is not None and reduction > 0.05
    assert width["cuped_"] < width[""]
    assert pick(found, "recsys_eval_ab_cuped_p_value", method="sequential", **LABELS) > 0.05


def same_as_replay(store, settings, steps: list[list[bytes]], directory) -> None:
    """Replay's CUPED comparisons equal one fresh read of the live store."""
    files = EventSet(
        [json.loads(raw) for step in steps for raw in step if b'"items"' in raw],
        [json.loads(raw) for step in steps for raw in step if b'"items"' not in raw],
    ).write(directory)
    replayed = evaluate_files(*files, settings, progress=False)["ab"]["exp"]
    fresh = LiveReader(store, readout_config(settings), store.frontier)
    readout = fresh._experiment(settings.ab.experiment_list()[0])
    assert replayed["cuped"] and len(replayed["cuped"]) == len(readout.cuped)
    for got, want in zip(readout.cuped, replayed["cuped"], strict=True):
        assert (got.variant, got.k, got.adjusted == "true") == (
            want["variant"],
            want["k"],
            want["adjusted"],
        )
        for name in ("diff", "lower", "upper", "p_sequential"):
            assert getattr(got, name) == pytest.approx(want[name], rel=1e-9, abs=1e-12), name
        assert got.reduction == pytest.approx(want["variance_reduction"], rel=1e-9)


@pytest.mark.parametrize("ahead", ["impressions", "interactions"])
def test_covariates_do_not_depend_on_which_topic_runs_ahead(ahead) -> None:
    """Two days of one topic are consumed before the other's (a backlog read unevenly):
    an exposure read with the interactions behind waits for the watermark, so every
    arm's covariate is still exactly the reference's (read at once, the exposures would
    miss the interactions of the day before)."""
    settings = load_settings(environ={}, overrides=SETTINGS)
    tasks, clock, _ = live(settings)
    state = tasks.owned[0].engine.state
    steps = hourly_traffic(
        random.Random(7), hours=20 * 6, users=800, step_ms=STEP, per_step=(40, 60)
    )
    offsets = {"impressions": 0, "interactions": 0}
    behind = "interactions" if ahead == "impressions" else "impressions"
    waited = 0
    for start in range(0, len(steps), 12):  # two days a poll
        payloads = [p for step in steps[start : start + 12] for p in step]
        deliver(tasks, clock, payloads, offsets, (ahead,))
        waited = max(waited, len(state.pending))
        deliver(tasks, clock, payloads, offsets, (behind,))
    for _ in range(3):  # the watermark passes the last day by idleness
        clock.now += DAY
        tasks.apply([], {"impressions:0": clock.now, "interactions:0": clock.now})
    tasks.settle()
    assert not state.pending
    assert (waited > 100) == (ahead == "impressions")
    blocks = tasks.store.experiment_blocks("exp")
    x, users = (tasks.store.layout.schema.index(n) for n in COVARIATE)
    for variant, (total, covered) in reference(steps).items():
        assert covered > 100
        assert blocks[variant][..., x].sum() == total
        assert blocks[variant][..., users].sum() == covered
