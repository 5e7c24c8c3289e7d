"""Propensity estimators: hand-computed cases, exact-count recovery, and recovery of the
simulator's true propensities end to end through ``evaluator replay``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evaluator.app.cli import main
from evaluator.app.simulate import FileSink, simulate
from evaluator.core.propensity.estimation import (
    CLICK,
    SEP,
    Observation,
    em,
    estimate_all,
    harvesting,
    increments,
    randomized,
    tables,
    unpack,
)
from evaluator.core.simulator import SimulationConfig

RECOVERY_REQUESTS = 20_000
"""Requests (about 80,000 events) after which every estimator is within ETA_TOLERANCE."""
ETA_TOLERANCE = 0.1


def test_increments_pack_shown_and_clicks() -> None:
    obs = [
        Observation("c", ["x", "y", "z"], [1], ("swap", 3)),
        Observation("c", ["y", "x"], [0], None),
    ]
    counts = increments(obs, positions=2)
    assert unpack(counts[f"h{SEP}c{SEP}y{SEP}2"]) == (1, 1)
    assert unpack(counts[f"h{SEP}c{SEP}y{SEP}1"]) == (1, 1)
    assert f"h{SEP}c{SEP}z{SEP}3" not in counts  # beyond the counted positions
    assert f"r{SEP}swap{SEP}3" not in counts  # swap partner beyond the counted positions
    assert counts[f"r{SEP}base{SEP}1"] == 1 + CLICK


def test_harvesting_hand_computed() -> None:
    # item x: 100 shown at 1 with 40 clicks, 100 at 2 with 20; item y: 300 at 1 (90), 100 at 2 (15)
    counts = {
        f"h{SEP}c{SEP}x{SEP}1": 100 + 40 * CLICK,
        f"h{SEP}c{SEP}x{SEP}2": 100 + 20 * CLICK,
        f"h{SEP}c{SEP}y{SEP}1": 300 + 90 * CLICK,
        f"h{SEP}c{SEP}y{SEP}2": 100 + 15 * CLICK,
    }
    w_x, w_y = 100 * 100 / 200, 300 * 100 / 400
    expected = (w_x * 0.2 + w_y * 0.15) / (w_x * 0.4 + w_y * 0.3)
    got = harvesting(tables(counts, 2), min_clicks=1)
    assert got.theta[1] == pytest.approx(expected)
    assert got.lower[1] < expected < got.upper[1]


def test_randomized_topn_and_swap_hand_computed() -> None:
    topn = {f"r{SEP}topn{SEP}1": 200 + 50 * CLICK, f"r{SEP}topn{SEP}2": 200 + 20 * CLICK}
    assert randomized(tables(topn, 2), min_clicks=1).theta[1] == pytest.approx(20 / 50)
    swap = {f"r{SEP}base{SEP}1": 1000 + 300 * CLICK, f"r{SEP}swap{SEP}2": 100 + 12 * CLICK}
    assert randomized(tables(swap, 2), min_clicks=1).theta[1] == pytest.approx(0.12 / 0.3)


def test_em_recovers_theta_from_exact_expected_counts() -> None:
    rng = np.random.default_rng(0)
    theta = np.array([1.0, 0.6, 0.45, 0.3, 0.2])
    gamma = rng.uniform(0.1, 0.9, 40)
    counts = {}
    for i, g in enumerate(gamma):
        for k, t in enumerate(theta):
            n = 10_000
            counts[f"h{SEP}c{SEP}i{i}{SEP}{k + 1}"] = n + round(n * t * g) * CLICK
    got = em(tables(counts, 5), min_clicks=1, iterations=2000, tol=1e-12)
    # relevance is integrated on a grid of 32 values: dense rows (10,000 impressions)
    # between two grid values leave a relative error of about 0.5%
    np.testing.assert_allclose(got.theta, theta, rtol=0.01)


def test_thin_positions_fall_back_to_the_fitted_power_law() -> None:
    counts = {
        f"r{SEP}topn{SEP}{k}": 10_000 + int(10_000 * 0.3 * k**-1.0) * CLICK for k in range(1, 5)
    }
    counts[f"r{SEP}topn{SEP}5"] = 10  # no clicks
    got = randomized(tables(counts, 5), min_clicks=30)
    assert got.fallback.tolist() == [False, False, False, False, True]
    assert got.eta == pytest.approx(1.0, abs=0.01)
    assert got.theta[4] == pytest.approx(5**-got.eta)
    assert np.isnan(got.lower[4])


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("prop")
    config = SimulationConfig(seed=5, eta=1.0, randomized_fraction=0.1)
    sim = simulate(config, FileSink(out), RECOVERY_REQUESTS, progress=False)
    return out, sim.truth.as_dict()


def _replay(out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    args = ["replay", str(out / "impressions.jsonl"), str(out / "interactions.jsonl"), "--k", "10"]
    assert main([*args, "--output", "json", "--no-progress", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_estimator_recovers_the_simulated_power_law(simulated, capsys) -> None:
    out, truth = simulated
    report = _replay(out, capsys, "--estimate-propensity")
    for name in ("randomized", "harvesting", "em"):
        curve = report["propensity"][name]
        assert curve["eta"] == pytest.approx(truth["eta"], abs=ETA_TOLERANCE), name
        # every position's interval is finite and the truth is close to the estimate
        for k, (t, est) in enumerate(zip(truth["propensity"], curve["theta"], strict=True)):
            assert est == pytest.approx(t, abs=0.05 if k else 1e-12), (name, k)


def test_estimated_adjustment_moves_toward_the_debiased_truth(simulated, capsys) -> None:
    out, truth = simulated
    for estimator in ("randomized", "harvesting", "em"):
        report = _replay(out, capsys, "--propensity", "estimated", "--estimator", estimator)
        assert len(report["propensity"]["applied"]) == 10
        for variant, block in report["variants"].items():
            debiased = truth["ndcg"][variant]["@10"]["debiased"]
            raw, adjusted = block["ndcg"]["10"], block["ndcg_adjusted"]["10"]
            assert abs(adjusted - debiased) < abs(raw - debiased), (estimator, variant)


def test_estimate_all_on_no_data_has_no_curve() -> None:
    for e in estimate_all({}, 5).values():
        assert np.isnan(e.eta)
        assert not np.isfinite(e.theta[1:]).all() or e.fallback[1:].all()


@pytest.fixture(scope="module")
def sparse_fits() -> list[tuple[str, np.ndarray, float, object]]:
    """EM on 3,000 query contexts whose (context, item) rows hold a median of two
    impressions, for a power law and for a curve far from one (3 seeds each)."""
    from tests.propsim import power_law, sparse_counters, steps

    fits = []
    for name, theta in (("k^-0.7", power_law(0.7)), ("steps", steps())):
        for seed in range(3):
            counters, median = sparse_counters(seed, theta)
            fits.append((name, theta, median, em(tables(counters, theta.size))))
    return fits


def test_em_recovers_the_curve_on_sparse_contexts(sparse_fits) -> None:
    for name, theta, median, got in sparse_fits:
        assert median == 2
        assert not got.fallback.any()
        assert np.abs(got.theta - theta).max() <= 0.05, (name, got.theta)


def test_em_intervals_cover_the_truth_near_their_nominal_rate(sparse_fits) -> None:
    covered = [
        bool(lo <= t <= hi)
        for _, theta, _, got in sparse_fits
        for t, lo, hi in zip(theta[1:], got.lower[1:], got.upper[1:], strict=True)
    ]
    assert 0.8 <= np.mean(covered) <= 0.99, np.mean(covered)


def test_em_without_clicks_at_the_first_position_gives_no_curve() -> None:
    """theta_1 = 1 anchors the curve: rows never clicked at position 1 cannot place it."""
    counts = {}
    for i in range(300):
        for k, clicks in ((1, 0), (2, 1 if i % 3 else 0), (3, 1 if i % 4 == 0 else 0)):
            counts[f"h{SEP}c{i}{SEP}x{SEP}{k}"] = 5 + clicks * CLICK
    got = em(tables(counts, 3), min_clicks=1)
    assert np.isnan(got.theta[1:]).all() and got.curve() is None


def test_harvesting_intervals_cover_the_truth_on_sparse_contexts() -> None:
    """The pivot estimator's intervals take the (context, item) pairs as their units: a
    binomial variance per pair is 0 for a pair seen once or twice (a CTR of 0 or 1), and
    such intervals covered the true curve in 31% of cases here (now ~98%)."""
    from tests.propsim import power_law, sparse_counters, steps

    covered = []
    for theta in (power_law(0.7), steps()):
        for seed in range(3):
            counters, median = sparse_counters(seed, theta)
            assert median == 2
            got = harvesting(tables(counters, theta.size))
            covered += [
                bool(lo <= t <= hi)
                for t, lo, hi in zip(theta[1:], got.lower[1:], got.upper[1:], strict=True)
            ]
    assert 0.85 <= np.mean(covered) <= 1.0, np.mean(covered)


def test_estimated_without_a_curve_says_it_did_not_adjust(tmp_path, capsys) -> None:
    """No randomised traffic for the randomized estimator: no curve, so adjusted equals
    raw; the report's settings and stderr say so (before, nothing did)."""
    sim = simulate(
        SimulationConfig(seed=6, randomized_fraction=0.0), FileSink(tmp_path), 300, progress=False
    )
    assert sim.truth
    args = ["replay", str(tmp_path / "impressions.jsonl"), str(tmp_path / "interactions.jsonl")]
    extra = ["--propensity", "estimated", "--estimator", "randomized"]
    assert main([*args, *extra, "--output", "json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["settings"]["propensity"] == "estimated:randomized (no curve: not applied)"
    assert "adjusted nDCG equals raw" in captured.err
    block = report["variants"][next(iter(report["variants"]))]
    assert block["ndcg_adjusted"] == block["ndcg"]


def test_identical_rows_merge_as_numpy_unique_merges_them() -> None:
    """EM merges identical (shown, clicks) rows by a lexsort: the rows, their order (so
    every later sum adds in the same order) and their counts are numpy's."""
    from evaluator.core.propensity.em import _unique_rows

    rng = np.random.default_rng(7)
    for shape in ((0, 4), (1, 4), (500, 3), (20_000, 20)):
        rows = rng.integers(-2, 3, size=shape).astype(np.int64)
        want_rows, want_counts = np.unique(rows, axis=0, return_counts=True)
        got_rows, got_counts = _unique_rows(rows)
        assert np.array_equal(got_rows, want_rows) and np.array_equal(got_counts, want_counts)
