"""CUPED (:mod:`evaluator.core.ab.cuped`): the estimator against a direct regression,
and the adjusted A/B readout against simulated experiments whose truth is known
(:mod:`tests.absim`, read through the exporter's readout function at every look)."""

from __future__ import annotations

import math

import numpy as np

from evaluator.core.ab.cuped import (
    DAY_MS,
    adjust,
    count_day,
    moments,
    pre_exposure,
    pre_exposure_counts,
)
from evaluator.core.ab.stats import ratio_estimate
from tests.absim import Traffic, covariate_of, run, users_of

EXPERIMENTS = 500


def _buckets(rng: np.random.Generator, slope: float, noise: float) -> tuple[np.ndarray, ...]:
    n = rng.integers(20, 40, 128).astype(float)
    u = rng.integers(5, 10, 128).astype(float)
    x = rng.normal(2.0, 1.0, 128) * u
    y = 0.4 * n + slope * (x - 2.0 * u) + rng.normal(0.0, noise, 128)
    return y, n, x, u


def test_theta_is_the_regression_slope_of_the_linearised_metric_on_the_covariate() -> None:
    rng = np.random.default_rng(1)
    control, variant = _buckets(rng, 0.3, 1.0), _buckets(rng, 0.3, 1.0)
    adjusted = adjust(moments(*control), moments(*variant))
    # the delta method's linearisation, then least squares through the origin, pooled
    e, f = [], []
    for y, n, x, u in (control, variant):
        b = y.size
        e.append((y - y.sum() / n.sum() * n) / (n.sum() / b))
        f.append((x - x.sum() / u.sum() * u) / (u.sum() / b))
    slope = float(np.concatenate(e) @ np.concatenate(f) / (np.concatenate(f) ** 2).sum())
    assert math.isclose(adjusted.theta, slope, rel_tol=1e-9)
    assert adjusted.reduction > 0.3  # a strong covariate removes much of the variance


def test_without_covariate_users_the_estimates_are_the_unadjusted_ones() -> None:
    rng = np.random.default_rng(2)
    y, n, _, u = _buckets(rng, 0.3, 1.0)
    none = np.zeros_like(u)
    adjusted = adjust(moments(y, n, none, none), moments(y * 1.1, n, none, none))
    raw = ratio_estimate(y, n)
    assert adjusted.theta == 0.0 and adjusted.reduction == 0.0
    assert math.isclose(adjusted.control.mean, raw.mean)
    assert math.isclose(adjusted.control.variance, raw.variance)


def test_an_unrelated_covariate_removes_next_to_nothing() -> None:
    rng = np.random.default_rng(3)
    control, variant = _buckets(rng, 0.0, 1.0), _buckets(rng, 0.0, 1.0)
    assert abs(adjust(moments(*control), moments(*variant)).reduction) < 0.1


def test_the_simulated_covariate_correlates_about_0_6_with_the_metric() -> None:
    """The scenario of the width test below: per user, the covariate against the
    linearised nDCG (the share of its variance CUPED can remove is ρ²)."""
    rng = np.random.default_rng(4)
    data = users_of(rng, Traffic(users=200_000))
    value, has = covariate_of(rng, data)
    _, _, requests, _, ndcg = data
    e = ndcg - ndcg.sum() / requests.sum() * requests
    f = np.where(has > 0, value - value[has > 0].mean(), 0.0)
    assert 0.5 <= np.corrcoef(e, f)[0, 1] <= 0.7


def test_the_adjusted_interval_is_at_most_0_85_of_the_unadjusted_width() -> None:
    results = [run(s, Traffic(users=40_000, covariate=True)) for s in range(100)]
    ratios = [(r.cuped_upper - r.cuped_lower) / (r.final_upper - r.final_lower) for r in results]
    # each width is a running intersection's, so single experiments vary around it
    assert np.median(ratios) <= 0.85 and np.mean(ratios) <= 0.85
    assert np.median([r.reduction for r in results]) >= 0.25


def test_aa_false_alarms_of_the_adjusted_interval_over_50_looks() -> None:
    results = [run(s, Traffic(users=8_000, covariate=True)) for s in range(EXPERIMENTS)]
    assert np.mean([r.cuped_flagged for r in results]) <= 0.05
    assert not any(r.crossed for r in results)


def test_aa_false_alarms_of_the_adjusted_interval_with_heavy_users() -> None:
    traffic = Traffic(users=20_000, heavy=0.005, covariate=True)
    results = [run(40_000 + s, traffic) for s in range(EXPERIMENTS)]
    assert np.mean([r.cuped_flagged for r in results]) <= 0.05
    assert not any(r.crossed for r in results)


def test_the_adjusted_interval_covers_the_true_difference_at_every_look() -> None:
    """+0.02 on the treatment's per-request mean: the running intersection of the
    adjusted intervals holds it at every ready look in at least 95% of 400 experiments,
    and excludes 0 at the end more often than the unadjusted one does."""
    traffic = Traffic(users=20_000, lift=0.02, covariate=True)
    results = [run(60_000 + s, traffic) for s in range(400)]
    assert np.mean([r.cuped_missed for r in results]) <= 0.05
    detected = np.mean([r.cuped_lower > 0 for r in results])
    assert detected > np.mean([r.final_lower > 0 for r in results])


def test_the_kept_activity_and_both_covariate_functions_match_a_direct_count() -> None:
    """Per user, days counted in any order (the latest few out of order, as topics
    deliver them), the activity kept is the count of every day, and the live
    (:func:`pre_exposure`) and replay (:func:`pre_exposure_counts`) covariates equal a
    direct count of the interactions on the lookback's days before the exposure's."""
    rng = np.random.default_rng(5)
    lookback = 14
    users, times, exposed, at, want = [], [], [], [], []
    for u in range(300):
        days = sorted(rng.integers(20_000, 20_060, rng.integers(0, 40)).tolist())
        if len(days) > 3:  # a few arrive late
            days[-3:] = rng.permutation(days[-3:]).tolist()
        kept: list[int] = []
        for d in days:
            count_day(kept, d)
        assert dict(zip(kept[::2], kept[1::2], strict=True)) == {d: days.count(d) for d in days}
        assert kept[::2] == sorted(set(days))
        exposure = int(rng.integers(20_000, 20_062)) * DAY_MS + int(rng.integers(DAY_MS))
        day = exposure // DAY_MS
        truth = sum(day - lookback <= d < day for d in days)
        assert pre_exposure(kept, exposure - exposure % DAY_MS, lookback) == truth
        users += [f"u{u}"] * len(days)
        times += [d * DAY_MS + 1 for d in days]
        exposed.append(f"u{u}")
        at.append(exposure)
        want.append(truth)
    got = pre_exposure_counts(exposed, np.asarray(at), users, np.asarray(times), lookback)
    assert got.tolist() == want


def test_activity_is_kept_only_for_an_experiment_that_can_use_it() -> None:
    """In the ``default`` experiment a user's first impression is their exposure: no
    activity is kept and no covariate read, live (the engine) as in replay (the readout's
    rules); an experiment with a ``start`` or over some variants turns it on."""
    from evaluator.config import load_settings
    from evaluator.config.plain import engine_config, readout_config

    def days(ab: dict) -> tuple[int, int]:
        settings = load_settings(environ={}, overrides={"ab": ab})
        return (
            engine_config(settings).cuped_lookback_days,
            readout_config(settings).ab.cuped_lookback_days,
        )

    assert days({}) == (0, 0)
    assert days({"experiments": {"e": {"start": 1_700_000_000_000}}}) == (14, 14)
    assert days({"experiments": {"e": {"variants": ["A", "B"]}}}) == (14, 14)
    assert days({"experiments": {"e": {"variants": ["A"]}}, "cuped_lookback": "7d"}) == (7, 7)
    assert days({"experiments": {"e": {"variants": ["A"]}}, "cuped_lookback": 0}) == (0, 0)
