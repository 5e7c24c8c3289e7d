import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.core.metrics.ndcg import dcg, ndcg
from tests import reference

grade_lists = st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=30)


def matrix(rows: list[list[float]]) -> np.ndarray:
    width = max(len(r) for r in rows)
    out = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def test_hand_computed_exponential() -> None:
    # grades [3, 0, 2]: DCG@3 = 7/1 + 0 + 3/2 = 8.5 ; ideal [3, 2, 0]: 7 + 3/log2(3)
    expected = 8.5 / (7 + 3 / math.log2(3))
    assert ndcg(np.array([[3.0, 0.0, 2.0]]), [3])[0, 0] == pytest.approx(expected, abs=1e-12)


def test_hand_computed_linear_and_cutoff() -> None:
    # grades [0, 1, 2], K=2, linear: DCG = 1/log2(3); IDCG = 2 + 1/log2(3)
    got = ndcg(np.array([[0.0, 1.0, 2.0]]), [2], gain="linear")[0, 0]
    assert got == pytest.approx((1 / math.log2(3)) / (2 + 1 / math.log2(3)), abs=1e-12)


def test_k_larger_than_list_and_several_ks() -> None:
    got = ndcg(np.array([[0.0, 1.0]]), [1, 2, 50])
    # @1: nothing relevant at rank 1 -> 0 ; @2 and @50 identical: (1/log2 3) / 1
    assert got[0].tolist() == pytest.approx([0.0, 1 / math.log2(3), 1 / math.log2(3)])


def test_no_relevant_item_scores_zero() -> None:
    assert ndcg(np.zeros((2, 5)), [10]).tolist() == [[0.0], [0.0]]


def test_dcg_and_ideal_are_reported() -> None:
    actual, ideal = dcg(np.array([[1.0, 0.0]]), [2], gain="linear")
    assert actual[0, 0] == pytest.approx(1.0)
    assert ideal[0, 0] == pytest.approx(1.0)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        ndcg(np.zeros((1, 3)), [0])
    with pytest.raises(ValueError):
        ndcg(np.zeros(3), [1])
    with pytest.raises(ValueError):
        ndcg(np.ones((1, 3)), [1], gain="cubic")  # type: ignore[arg-type]


def test_zero_width_matrix() -> None:
    assert ndcg(np.zeros((3, 0)), [10]).shape == (3, 1)


@given(
    st.lists(grade_lists, min_size=1, max_size=20),
    st.sampled_from(["exponential", "linear"]),
    st.integers(min_value=1, max_value=35),
)
@settings(max_examples=200, deadline=None)
def test_matches_straightforward_implementation(rows: list[list[int]], kind: str, k: int) -> None:
    got = ndcg(matrix(rows), [k], gain=kind)[:, 0]  # type: ignore[arg-type]
    want = [reference.ndcg(r, k, kind) for r in rows]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@given(grade_lists, st.integers(min_value=1, max_value=35))
def test_bounded_and_ideal_order_scores_one(grades: list[int], k: int) -> None:
    value = ndcg(matrix([grades]), [k])[0, 0]
    assert 0.0 <= value <= 1.0
    if any(grades):
        ideal = sorted(grades, reverse=True)
        assert ndcg(matrix([ideal]), [k])[0, 0] == pytest.approx(1.0, abs=1e-12)


@given(grade_lists, st.data())
def test_moving_a_more_relevant_item_up_never_lowers_the_score(grades: list[int], data) -> None:
    if len(grades) < 2:
        return
    i = data.draw(st.integers(min_value=0, max_value=len(grades) - 2))
    j = data.draw(st.integers(min_value=i + 1, max_value=len(grades) - 1))
    k = data.draw(st.integers(min_value=1, max_value=len(grades) + 2))
    if grades[j] <= grades[i]:
        return
    swapped = list(grades)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    before, after = ndcg(matrix([grades, swapped]), [k])[:, 0]
    assert after >= before - 1e-12
