"""Seasonality and an injected regression in the simulator (evaluator.core.seasons):
the hourly and daily request counts and the click rate follow the configured cycles,
an injection cuts one variant's clicks from its start, and the defaults leave the
simulated traffic byte for byte what it was before the seasons existed."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from evaluator.app.cli import main
from evaluator.core.seasons import DAY_MS, HOUR_MS, Regression, Seasons, is_weekend
from evaluator.core.simulator import T0_MS, SimulationConfig, Simulator

QUIET = {"out_of_order_fraction": 0.0, "duplicate_fraction": 0.0, "malformed_fraction": 0.0}
"""No duplicate or malformed events: every payload is one event of its own."""
Z_MAX = 4.5
"""|observed - expected| / standard error allowed per bin (a correct model fails one of
24 bins about once in 6,000 seeds; the tests' seeds are fixed)."""

Event = dict[str, Any]


def _run(config: SimulationConfig, requests: int) -> tuple[Simulator, list[Event], list[Event]]:
    sim = Simulator(config)
    impressions: list[Event] = []
    interactions: list[Event] = []
    for chunk in sim.chunks(requests):
        for e in chunk:
            event = json.loads(e.payload)
            (impressions if e.kind == "impressions" else interactions).append(event)
    return sim, impressions, interactions


def _wave_integral_ms(a_ms: int, b_ms: int, amplitude: float, peak_ms: int) -> float:
    """∫ 1 + amplitude cos(2π (t - peak) / 1 day) dt over [a, b] (the documented profile)."""
    w = 2 * math.pi / DAY_MS
    return (b_ms - a_ms) + amplitude / w * (
        math.sin(w * (b_ms - peak_ms)) - math.sin(w * (a_ms - peak_ms))
    )


def _worst_z(observed: list[float], expected: list[float], variance: list[float]) -> float:
    return max(
        abs(o - e) / math.sqrt(v) for o, e, v in zip(observed, expected, variance, strict=True)
    )


# -- defaults -------------------------------------------------------------------------


def _digest(config: SimulationConfig, requests: int) -> str:
    sim = Simulator(config)
    h = hashlib.sha256()
    for chunk in sim.chunks(requests):
        for e in chunk:
            h.update(b"%s %s %s\n" % (e.kind.encode(), e.key, e.payload))
    h.update(json.dumps(sim.truth.as_dict(), sort_keys=True).encode())
    return h.hexdigest()


GOLDEN = [
    (
        SimulationConfig(seed=3),
        "05fbc5e67a95dced4cf00200493103e4905596d0d72eab520366d086280ceab8",
    ),
    (
        SimulationConfig(seed=4, mode="video", interleave=True, late_fraction=0.05),
        "ebaa885936527dcc5feded33049683dd2c2781ea68412dce8e75daa59becdeb3",
    ),
    (
        SimulationConfig(
            seed=5, randomization="swap", variants=(("a", 1.0), ("b", 0.5), ("c", 0.1))
        ),
        "55a234f0ad17cdd2b92e87901ee28baffacaf9ae130fdbacdd8d5f38339db3eb",
    ),
]
"""Digests of 400 requests' events and truth, taken before the seasons were added
(numpy 2.4): the default traffic and its ground truth must not change."""


@pytest.mark.parametrize(("config", "digest"), GOLDEN)
def test_defaults_give_the_events_from_before_the_seasons(
    config: SimulationConfig, digest: str
) -> None:
    assert _digest(config, 400) == digest
    off = replace(config, seasons=Seasons(0.0, 0.0, 0.0, peak_ms=3 * HOUR_MS), regression=None)
    assert _digest(off, 400) == digest


def test_a_placebo_injection_changes_no_event() -> None:
    """A drop of 0 (a detector's false-alarm run) is the traffic without an injection."""
    config = SimulationConfig(seed=9)
    placebo = replace(config, regression=Regression("treatment", 0.0, 2_000))
    assert _digest(placebo, 1_000) != _digest(config, 1_000)  # the truth gains its record
    a, b = Simulator(config), Simulator(placebo)
    assert [e for c in a.chunks(1_000) for e in c] == [e for c in b.chunks(1_000) for e in c]


# -- the arithmetic -------------------------------------------------------------------


def test_the_rate_peaks_in_the_evening_and_dips_at_weekends() -> None:
    daily = Seasons(daily_amplitude=0.5)
    assert daily.rate_factor(T0_MS + 20 * HOUR_MS) == pytest.approx(1.5)
    assert daily.rate_factor(T0_MS + 8 * HOUR_MS) == pytest.approx(0.5)
    assert daily.rate_factor(T0_MS + 14 * HOUR_MS) == pytest.approx(1.0)
    weekly = Seasons(weekly_dip=0.4)
    for day in range(14):
        t = T0_MS + day * DAY_MS + 7 * HOUR_MS
        weekday = datetime.fromtimestamp(t / 1000, UTC).weekday()
        assert is_weekend(t) == (weekday >= 5)
        assert weekly.rate_factor(t) == pytest.approx(0.6 if weekday >= 5 else 1.0)
    times = np.array([T0_MS + 20 * HOUR_MS, T0_MS + 8 * HOUR_MS], dtype=np.int64)
    assert Seasons(relevance_amplitude=0.3).relevance_factor(times).tolist() == pytest.approx(
        [1.3, 0.7]
    )


def test_a_regression_applies_from_its_start() -> None:
    regression = Regression("treatment", 0.25, after_ms=HOUR_MS)
    assert regression.start_ms(T0_MS) == T0_MS + HOUR_MS
    times = np.array([T0_MS, T0_MS + HOUR_MS - 1, T0_MS + HOUR_MS], dtype=np.int64)
    assert regression.factor(times, T0_MS).tolist() == [1.0, 1.0, 0.75]


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: Seasons(daily_amplitude=1.0), "daily_amplitude"),
        (lambda: Seasons(weekly_dip=-0.1), "weekly_dip"),
        (lambda: Seasons(relevance_amplitude=float("nan")), "relevance_amplitude"),
        (lambda: Seasons(peak_ms=DAY_MS), "peak_ms"),
        (lambda: Regression("treatment", 1.5), "drop"),
        (lambda: Regression("treatment", 0.1, after_ms=-1), "after_ms"),
        (lambda: SimulationConfig(regression=Regression("nobody", 0.1)), "regression"),
        (
            lambda: SimulationConfig(
                interleave=True,
                variants=(("a", 1.0), ("b", 0.5), ("c", 0.1)),
                regression=Regression("c", 0.1),
            ),
            "regression",
        ),
    ],
)
def test_bad_season_settings_are_refused(make: Any, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        make()


# -- traffic ------------------------------------------------------------------------------


def test_hourly_requests_follow_the_daily_profile() -> None:
    """A simulated day at 0.25 requests/s: each hour's count is the rate times the
    profile's integral over the hour, within sampling error (Poisson)."""
    amplitude, rate = 0.6, 0.25
    config = SimulationConfig(
        seed=12, requests_per_second=rate, seasons=Seasons(amplitude), **QUIET
    )
    _, impressions, _ = _run(config, 23_000)
    stamps = [e["timestamp"] for e in impressions]
    assert max(stamps) >= T0_MS + DAY_MS
    hours = Counter((t - T0_MS) // HOUR_MS for t in stamps if t < T0_MS + DAY_MS)
    observed = [float(hours[h]) for h in range(24)]
    peak_ms = Seasons().peak_ms
    expected = [
        rate
        / 1000
        * _wave_integral_ms(T0_MS + h * HOUR_MS, T0_MS + (h + 1) * HOUR_MS, amplitude, peak_ms)
        for h in range(24)
    ]
    assert _worst_z(observed, expected, expected) < Z_MAX
    assert observed[20] > 2.5 * observed[8]  # (1 + 0.6) / (1 - 0.6) = 4 at the extremes


def test_weekend_traffic_is_lower_by_the_dip() -> None:
    """A simulated week from Thursday 2026-01-01: Saturday's and Sunday's counts are the
    weekdays' times 1 - dip (the daily wave integrates to 1 over each day)."""
    dip, rate = 0.4, 0.05
    seasons = Seasons(daily_amplitude=0.3, weekly_dip=dip)
    config = SimulationConfig(seed=13, requests_per_second=rate, seasons=seasons, **QUIET)
    _, impressions, _ = _run(config, 28_000)
    stamps = [e["timestamp"] for e in impressions]
    assert max(stamps) >= T0_MS + 7 * DAY_MS
    days = Counter((t - T0_MS) // DAY_MS for t in stamps if t < T0_MS + 7 * DAY_MS)
    weekend = [day for day in range(7) if is_weekend(T0_MS + day * DAY_MS)]
    assert weekend == [2, 3]  # 2026-01-03 and -04
    observed = [float(days[day]) for day in range(7)]
    full = rate * DAY_MS / 1000
    expected = [full * (1 - dip) if day in weekend else full for day in range(7)]
    assert _worst_z(observed, expected, expected) < Z_MAX
    weekday_mean = sum(observed[d] for d in range(7) if d not in weekend) / 5
    assert sum(observed[d] for d in weekend) / 2 / weekday_mean == pytest.approx(1 - dip, abs=0.04)


def _expected_clicks(sim: Simulator, impression: Event, factor: float = 1.0) -> tuple[float, float]:
    """Expected clicks of an impression and their variance: sum over positions of
    theta_k * min(gamma * factor, 1)."""
    seg = int(impression["context"].removeprefix("seg"))
    items = [int(i.removeprefix("i")) for i in impression["items"]]
    p = sim.theta * np.minimum(sim.gamma[seg, items] * factor, 1.0)
    return float(p.sum()), float((p * (1 - p)).sum())


def _clicks(interactions: list[Event]) -> Counter[str]:
    return Counter(e["request_id"] for e in interactions if e["type"] == "click")


def test_the_click_rate_follows_the_relevance_cycle() -> None:
    """Clicks per 3-hour bin of a simulated day are those of the click model with every
    gamma times 1 + a cos(2π (t - 20:00) / 1 day), clipped to 1."""
    amplitude = 0.5
    seasons = Seasons(relevance_amplitude=amplitude)
    config = SimulationConfig(seed=14, requests_per_second=0.25, seasons=seasons, **QUIET)
    sim, impressions, interactions = _run(config, 23_000)
    clicks = _clicks(interactions)
    observed, expected, variance, steady = ([0.0] * 8 for _ in range(4))
    w = 2 * math.pi / DAY_MS
    for imp in impressions:
        t = imp["timestamp"]
        if t >= T0_MS + DAY_MS:
            continue
        b = (t - T0_MS) // (3 * HOUR_MS)
        mean, var = _expected_clicks(sim, imp, 1 + amplitude * math.cos(w * (t - 20 * HOUR_MS)))
        observed[b] += clicks[imp["request_id"]]
        expected[b] += mean
        variance[b] += var
        steady[b] += _expected_clicks(sim, imp)[0]
    assert _worst_z(observed, expected, variance) < Z_MAX
    assert observed[6] / steady[6] > 1.15  # 18:00-21:00: the evening peak (clipped at 1)
    assert observed[2] / steady[2] < 0.65  # 06:00-09:00: the morning trough


# -- an injected regression --------------------------------------------------------------


def _by_request(impressions: list[Event], interactions: list[Event], until_ms: int) -> dict:
    """Each request before ``until_ms``: its impression and its sorted interactions."""
    shown = {e["request_id"]: e for e in impressions if e["timestamp"] < until_ms}
    acted: dict[str, list[str]] = defaultdict(list)
    for e in interactions:
        if e["request_id"] in shown:
            acted[e["request_id"]].append(json.dumps(e, sort_keys=True))
    return {rid: (imp, sorted(acted[rid])) for rid, imp in shown.items()}


def _click_ratio(
    run: tuple[Simulator, list[Event], list[Event]], variant: str, start: int
) -> float:
    """Clicks on ``variant``'s lists from ``start`` on over the clicks expected without
    an injection (1: as before; 1 - drop: regressed)."""
    sim, impressions, interactions = run
    clicks = _clicks(interactions)
    observed = expected = 0.0
    for imp in impressions:
        if imp["variant"] == variant and imp["timestamp"] >= start:
            observed += clicks[imp["request_id"]]
            expected += _expected_clicks(sim, imp)[0]
    return observed / expected


def test_an_injected_regression_cuts_one_variant_from_its_start() -> None:
    """A 30% drop of the treatment's relevance after 100 s of 200: before it, every
    request's events are the placebo run's; from it, the treatment's clicks fall to 70%
    of the click model's and the control's stay; the truth records the drop and the
    expected nDCG before and after."""
    drop, after_ms, requests = 0.3, 100_000, 20_000
    config = SimulationConfig(seed=21, **QUIET)
    placebo = _run(replace(config, regression=Regression("treatment", 0.0, after_ms)), requests)
    injected = _run(replace(config, regression=Regression("treatment", drop, after_ms)), requests)
    start = T0_MS + after_ms
    before = _by_request(*placebo[1:], start)
    assert len(before) > 9_000
    assert before == _by_request(*injected[1:], start)
    assert _click_ratio(injected, "treatment", start) == pytest.approx(1 - drop, abs=0.05)
    assert _click_ratio(injected, "control", start) == pytest.approx(1.0, abs=0.05)
    assert _click_ratio(placebo, "treatment", start) == pytest.approx(1.0, abs=0.05)
    truth = injected[0].truth.as_dict()["regression"]
    reference = placebo[0].truth.as_dict()["regression"]
    assert (truth["variant"], truth["drop"], truth["start_ms"]) == ("treatment", drop, start)
    for variant in ("control", "treatment"):
        for kind in ("raw", "debiased"):
            value = truth["ndcg"]["before"][variant]["@10"][kind]
            assert value == pytest.approx(reference["ndcg"]["before"][variant]["@10"][kind])
    assert truth["requests"]["before"] == reference["requests"]["before"]
    after, was = truth["ndcg"]["after"], reference["ndcg"]["after"]
    assert after["treatment"]["@10"]["raw"] < was["treatment"]["@10"]["raw"] - 0.03
    assert after["control"]["@10"]["raw"] == pytest.approx(was["control"]["@10"]["raw"], abs=0.02)


def test_an_interleaved_regression_cuts_the_variants_team() -> None:
    """Interleaving: the regressed ranker's team's items are the ones cut; with a drop of
    1 none of them is clicked and the truth prefers the other ranker outright."""
    regression = Regression("treatment", 1.0, after_ms=0)
    config = SimulationConfig(seed=15, interleave=True, regression=regression, **QUIET)
    sim, impressions, interactions = _run(config, 2_000)
    teams = {
        (imp["request_id"], item): team
        for imp in impressions
        for item, team in zip(imp["items"], imp["teams"], strict=True)
    }
    credited = Counter(teams[e["request_id"], e["item_id"]] for e in interactions)
    assert credited["B"] == 0 and credited["A"] > 500
    assert sim.truth.interleaving()["preference"] == pytest.approx(-1.0)


# -- the command line ---------------------------------------------------------------------


def test_simulate_cli_takes_the_season_flags(tmp_path, capsys) -> None:
    args = ["simulate", "--out-dir", str(tmp_path), "--requests", "300", "--no-progress"]
    flags = ["--daily-amplitude", "0.5", "--weekly-dip", "0.2", "--relevance-amplitude", "0.3"]
    assert main([*args, *flags, "--inject-regression", "treatment:3%:2s"]) == 0
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["seasons"] == {
        "daily_amplitude": 0.5,
        "weekly_dip": 0.2,
        "relevance_amplitude": 0.3,
        "peak_ms": 20 * HOUR_MS,
    }
    regression = truth["regression"]
    assert (regression["variant"], regression["drop"]) == ("treatment", 0.03)
    assert regression["start_ms"] == T0_MS + 2_000
    assert sum(regression["requests"]["after"].values()) > 0
    at = "2026-01-01T00:00:05Z"
    assert main([*args, "--inject-regression", f"control:0.1:{at}"]) == 0
    regression = json.loads((tmp_path / "truth.json").read_text())["regression"]
    assert (regression["variant"], regression["start_ms"]) == ("control", T0_MS + 5_000)


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (["--daily-amplitude", "1"], "--daily-amplitude"),
        (["--weekly-dip", "-0.5"], "--weekly-dip"),
        (["--relevance-amplitude", "2"], "--relevance-amplitude"),
        (["--daily-amplitude", "x"], "--daily-amplitude"),
        (["--inject-regression", "treatment:0.03"], "--inject-regression"),
        (["--inject-regression", "nobody:0.03:6h"], "--inject-regression"),
        (["--inject-regression", "treatment:1.5:6h"], "DROP"),
        (["--inject-regression", "treatment:x:6h"], "DROP"),
        (["--inject-regression", "treatment:0.03:soon"], "AFTER"),
        (["--inject-regression", "treatment:0.03:2025-12-31T00:00:00Z"], "before the"),
    ],
)
def test_bad_season_flags_stop_with_one_line_naming_the_flag(tmp_path, capsys, bad, needle) -> None:
    try:
        code = main(["simulate", "--out-dir", str(tmp_path), "--requests", "10", *bad])
    except SystemExit as exc:  # argparse's own errors (not a number)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
