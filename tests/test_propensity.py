import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.core.metrics.ndcg import ndcg
from evaluator.core.propensity.models import (
    NoBias,
    PositionTable,
    PowerLaw,
    ips_weights,
    parse_propensity,
)
from tests import reference


def test_power_law_weights_with_clip() -> None:
    w = ips_weights(PowerLaw(1.0), 30, clip=0.05)
    assert w[:3].tolist() == pytest.approx([1.0, 2.0, 3.0])
    assert w[25] == pytest.approx(20.0)  # theta_26 = 1/26 < 0.05, clipped


def test_table_is_normalised_and_extended() -> None:
    theta = PositionTable((0.8, 0.4, 0.2)).theta(5)
    assert theta.tolist() == pytest.approx([1.0, 0.5, 0.25, 0.25, 0.25])


def test_parse() -> None:
    assert isinstance(parse_propensity("none"), NoBias)
    assert parse_propensity("power(0.7)") == PowerLaw(0.7)
    assert parse_propensity("power:1") == PowerLaw(1.0)
    assert parse_propensity("table:1,0.5") == PositionTable((1.0, 0.5))
    assert parse_propensity([1, 0.5]) == PositionTable((1.0, 0.5))
    for bad in ("magic", "power(-1)", "table:1,0", "power(x)"):
        with pytest.raises(ValueError):
            parse_propensity(bad)
    with pytest.raises(ValueError):
        ips_weights(NoBias(), 3, clip=0)


def test_adjusted_hand_computed() -> None:
    # grades [0, 1], eta=1: weighted gains [0, 1*2]; DCG = 2/log2(3); ideal = 2/1
    w = ips_weights(PowerLaw(1.0), 2)
    got = ndcg(np.array([[0.0, 1.0]]), [2], gain="linear", weights=w)[0, 0]
    assert got == pytest.approx((2 / np.log2(3)) / 2)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=25), st.floats(0, 2), st.integers(1, 30))
def test_adjusted_stays_in_unit_interval_and_matches_reference(grades, eta, k) -> None:
    w = ips_weights(PowerLaw(eta), len(grades), clip=0.05)
    got = ndcg(np.array([grades], dtype=float), [k], weights=w)[0, 0]
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(reference.ndcg(grades, k, "exponential", list(w)), abs=1e-12)


def test_no_bias_equals_raw() -> None:
    rng = np.random.default_rng(0)
    g = rng.integers(0, 3, size=(50, 12)).astype(float)
    w = ips_weights(NoBias(), 12)
    np.testing.assert_array_equal(ndcg(g, [5, 10], weights=w), ndcg(g, [5, 10]))


def test_adjusted_ideal_orders_by_grade_not_by_weighted_gain() -> None:
    # grades [2, 0, 0, 1], weights [1, 2, 3, 4]: weighted gains [2, 0, 0, 4] (linear).
    # Ideal by grade: [2, 4] -> 2 + 4/log2(3); shown: 2 + 4/log2(5).
    w = np.array([1.0, 2.0, 3.0, 4.0])
    got = ndcg(np.array([[2.0, 0.0, 0.0, 1.0]]), [4], gain="linear", weights=w)[0, 0]
    assert got == pytest.approx((2 + 4 / np.log2(5)) / (2 + 4 / np.log2(3)))


def test_an_estimated_curve_is_extended_by_its_power_law() -> None:
    """Past the estimated positions (propensity.positions, 10 by default, while K may be
    20) the curve keeps falling as the power law fitted to it, from its last value; it
    took that last value at every later position before."""
    from evaluator.core.propensity.models import EstimatedCurve

    curve = EstimatedCurve(tuple(float(k) ** -0.8 for k in range(1, 11)))
    theta = curve.theta(20)
    assert theta[:10] == pytest.approx([k**-0.8 for k in range(1, 11)])
    assert theta[10:] == pytest.approx([k**-0.8 for k in range(11, 21)])
    assert EstimatedCurve((1.0,)).theta(3).tolist() == [1.0, 1.0, 1.0]
