import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.core.metrics.cutoff import cutoff_scores
from tests import reference


def test_hand_computed() -> None:
    # relevant at ranks 3 and 5 of a 6-item list
    s = cutoff_scores(np.array([[0.0, 0, 2, 0, 1, 0]]), [2, 3, 10])
    assert s.mrr[0].tolist() == pytest.approx([0.0, 1 / 3, 1 / 3])
    assert s.hit_rate[0].tolist() == [0.0, 1.0, 1.0]
    assert s.precision[0].tolist() == pytest.approx([0.0, 1 / 3, 2 / 10])
    assert s.recall[0].tolist() == pytest.approx([0.0, 0.5, 1.0])


def test_no_relevant_item() -> None:
    s = cutoff_scores(np.zeros((1, 4)), [1, 10])
    for arr in (s.mrr, s.hit_rate, s.precision, s.recall):
        assert arr.tolist() == [[0.0, 0.0]]


def test_rejects_bad_cutoffs() -> None:
    with pytest.raises(ValueError):
        cutoff_scores(np.zeros((1, 4)), [])


@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=25), min_size=1, max_size=15),
    st.integers(1, 30),
)
def test_matches_reference(rows: list[list[int]], k: int) -> None:
    width = max(map(len, rows))
    grades = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        grades[i, : len(r)] = r
    s = cutoff_scores(grades, [k])
    assert s.mrr[:, 0].tolist() == pytest.approx([reference.mrr(r, k) for r in rows])
    assert s.precision[:, 0].tolist() == pytest.approx([reference.hits(r, k) / k for r in rows])
    assert s.recall[:, 0].tolist() == pytest.approx([reference.recall(r, k) for r in rows])
    assert s.hit_rate[:, 0].tolist() == [float(reference.hits(r, k) > 0) for r in rows]
