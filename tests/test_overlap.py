import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.core.metrics.overlap import jaccard_at_k, rbo
from tests import reference


def test_jaccard() -> None:
    assert jaccard_at_k(["a", "b", "c"], ["b", "c", "d"], 3) == pytest.approx(0.5)
    assert jaccard_at_k(["a", "b", "c"], ["b", "c", "d"], 1) == 0.0
    assert jaccard_at_k([], [], 5) == 1.0


def test_rbo_extremes_and_hand_computed() -> None:
    assert rbo(list("abcde"), list("abcde")) == pytest.approx(1.0)
    assert rbo(list("abc"), list("xyz")) == pytest.approx(0.0)
    # [a, b] vs [b, a], p = 0.5: X1 = 0, X2 = 2 -> (1-p)/p * (0 + 2/2 * p^2) + 2/2 * p^2 = 0.5
    assert rbo(["a", "b"], ["b", "a"], p=0.5) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        rbo(["a"], ["a"], p=1.0)


distinct = st.lists(st.sampled_from(list("abcdefghijklmnop")), unique=True, min_size=1, max_size=12)


@given(distinct, distinct, st.floats(0.05, 0.95))
def test_rbo_matches_reference_for_uneven_lists(a, b, p) -> None:
    got = rbo(a, b, p)
    assert got == pytest.approx(reference.rbo_ext(a, b, p), abs=1e-12)
    assert got == pytest.approx(rbo(b, a, p), abs=1e-12)
    assert -1e-12 <= got <= 1 + 1e-12
