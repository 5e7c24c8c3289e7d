"""Team-draft interleaving through the live engine and the registered collector: the
simulator's interleaving mode (two rankers of known quality drafted into one list per
request) fed through the partition engine on the embedded store and on Redis, with a
new owner taking the partition over half-way.

Checked: the stored outcome sums equal a reference computed here from the events
(credit each relevant interaction to the team of its position), so the new owner
restored every open request's teams; the exported always-valid interval holds the
simulator's true preference at every look and excludes none at the end; the win
shares add up; replay of the same events reads the same figures.
"""

from __future__ import annotations

import json

import pytest

from evaluator.app.replay import evaluate_files
from evaluator.config import load_settings
from evaluator.config.plain import readout_config, tasks_config
from evaluator.core.ab.interleaving import pair_key
from evaluator.core.rows import INTERLEAVING
from evaluator.core.simulator import SimulationConfig, Simulator
from evaluator.engine.tasks import Tasks
from evaluator.readout.live import LiveReader
from tests.eventgen import EventSet
from tests.test_ab_exported import deliver, live, pick, scrape

SETTINGS = {"join": {"attribution_window": "5m"}, "kafka": {"partitioner": "trust"}}
PAIR = {"experiment": "default", "ranker_a": "control", "ranker_b": "treatment"}


def traffic(
    requests: int, seed: int, noises: tuple[float, float] = (0.6, 1.0)
) -> tuple[list[list[bytes]], float]:
    """Interleaved traffic in steps of 500 requests, and the true preference."""
    config = SimulationConfig(
        seed=seed,
        users=3_000,
        variants=(("treatment", noises[0]), ("control", noises[1])),  # team A: the second name
        interleave=True,
        requests_per_second=1.0,  # a step of 500 requests: 8 minutes
        duplicate_fraction=0.0,
        malformed_fraction=0.0,
        ks=(10, 20),
    )
    sim = Simulator(config)
    steps = [[e.payload for e in chunk] for chunk in sim.chunks(requests, chunk=500)]
    preference = sim.truth.interleaving()["preference"]
    assert isinstance(preference, float)
    return steps, preference


def reference(steps: list[list[bytes]]) -> tuple[float, float, float]:
    """The pair's outcome sum, informative requests and treatment's wins, from the
    events: each relevant interaction credited to the team of its item's position."""
    events = [json.loads(raw) for step in steps for raw in step]
    shown = {e["request_id"]: e for e in events if "items" in e}
    wins: dict[str, dict[str, int]] = {}
    for e in events:
        if "items" in e:
            continue
        request = shown[e["request_id"]]
        team = request["teams"][request["items"].index(e["item_id"])]
        ranker = request["interleaving"][team]
        tally = wins.setdefault(e["request_id"], {"control": 0, "treatment": 0})
        tally[ranker] += 1
    outcomes = [
        (t["treatment"] > t["control"]) - (t["treatment"] < t["control"]) for t in wins.values()
    ]
    return float(sum(outcomes)), float(len(outcomes)), float(outcomes.count(1))


@pytest.mark.parametrize("make_store", ["memory", "redis"], indirect=True)
def test_interleaving_through_the_live_engine(tmp_path, make_store) -> None:
    settings = load_settings(environ={}, overrides=SETTINGS)
    store = make_store(settings.layout(1))
    tasks, clock, registry = live(settings, store)
    steps, truth = traffic(12_000, seed=3)
    assert truth > 0.05  # the better ranker is preferred
    offsets = {"impressions": 0, "interactions": 0}
    looks = 0
    for n, step in enumerate(steps):
        if n == len(steps) // 2:  # a new owner takes over: open requests keep their teams
            tasks.settle()
            tasks = Tasks(store, tasks_config(settings, 1), clock_ms=clock)
            tasks.assign([0])
        deliver(tasks, clock, step, offsets)
        found = scrape(registry)
        lower = pick(found, "recsys_eval_interleaving_preference_lower", **PAIR)
        if lower is not None:
            upper = pick(found, "recsys_eval_interleaving_preference_upper", **PAIR)
            assert upper is not None and lower <= truth <= upper
            looks += 1
    assert looks >= 5
    for _ in range(2):  # the wall clock runs on: every request final
        clock.now += 24 * 3_600_000
        tasks.apply([], {"impressions:0": clock.now, "interactions:0": clock.now})
    tasks.settle()
    block = store.experiment_blocks("default")[pair_key("control", "treatment")]
    stored = tuple(float(block[..., store.layout.schema.index(c)].sum()) for c in INTERLEAVING)
    assert stored == reference(steps)
    found = scrape(registry)
    preference = pick(found, "recsys_eval_interleaving_preference", **PAIR)
    lower = pick(found, "recsys_eval_interleaving_preference_lower", **PAIR)
    upper = pick(found, "recsys_eval_interleaving_preference_upper", **PAIR)
    assert preference is not None and lower is not None and upper is not None
    assert 0 < lower <= truth <= upper and lower < preference < upper
    assert preference == pytest.approx(stored[0] / stored[1])
    assert pick(found, "recsys_eval_interleaving_p_value", method="sequential", **PAIR) < 0.05
    assert pick(found, "recsys_eval_interleaving_requests", **PAIR) == stored[1]
    assert pick(found, "recsys_eval_interleaving_ready", **PAIR) == 1.0
    shares = [
        pick(found, "recsys_eval_interleaving_win_share", ranker=r, **PAIR)
        for r in ("control", "treatment")
    ]
    assert shares[1] == pytest.approx(stored[2] / (2 * stored[2] - stored[0]))
    assert sum(shares) == pytest.approx(1.0)  # type: ignore[arg-type]
    same_as_replay(store, settings, steps, tmp_path)


def same_as_replay(store, settings, steps: list[list[bytes]], directory) -> None:
    """Replay's interleaving readout equals one fresh read of the live store."""
    events = [json.loads(raw) for step in steps for raw in step]
    files = EventSet(
        [e for e in events if "items" in e], [e for e in events if "items" not in e]
    ).write(directory)
    replayed = evaluate_files(*files, settings, progress=False)["ab"]["default"]["interleaving"]
    fresh = LiveReader(store, readout_config(settings), store.frontier)
    readout = fresh._experiment(settings.ab.experiment_list()[0])
    assert len(replayed) == len(readout.interleaving) == 1
    got, want = readout.interleaving[0], replayed[0]
    assert [got.first, got.second] == want["rankers"] == ["control", "treatment"]
    for name in ("preference", "lower", "upper", "p_sequential", "p_fixed", "share_second"):
        assert getattr(got, name) == pytest.approx(want[name], rel=1e-9, abs=1e-12), name
    assert got.requests == want["requests"]


def test_two_equal_rankers_are_never_told_apart_over_a_long_run() -> None:
    """A/A through the engine (rankers of equal noise): the exported always-valid
    interval holds 0 at every one of the looks over 30,000 interleaved requests, and the
    sequential p-value never falls below 0.05 (the rate over many experiments: 2.5% of
    200 in tests/test_interleaving.py, through the same readout)."""
    settings = load_settings(environ={}, overrides=SETTINGS)
    tasks, clock, registry = live(settings)
    steps, truth = traffic(30_000, seed=8, noises=(0.8, 0.8))
    assert abs(truth) < 0.01
    offsets = {"impressions": 0, "interactions": 0}
    looks = 0
    for step in steps:
        deliver(tasks, clock, step, offsets)
        found = scrape(registry)
        lower = pick(found, "recsys_eval_interleaving_preference_lower", **PAIR)
        if lower is not None:
            upper = pick(found, "recsys_eval_interleaving_preference_upper", **PAIR)
            assert upper is not None and lower <= 0.0 <= upper
            p = pick(found, "recsys_eval_interleaving_p_value", method="sequential", **PAIR)
            assert p is not None and p >= 0.05
            looks += 1
    assert looks >= 40
