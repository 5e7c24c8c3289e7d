import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from evaluator.core.cohort import COLD_START, ESTABLISHED, cohort_codes, earlier_counts

events = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50)), max_size=40)


@given(events, events, st.integers(0, 5))
def test_earlier_counts_match_a_direct_count(history, requests, cap) -> None:
    hu = np.array([u for u, _ in history], dtype=np.int64)
    ht = np.array([t for _, t in history], dtype=np.int64)
    ru = np.array([u for u, _ in requests], dtype=np.int64)
    rt = np.array([t for _, t in requests], dtype=np.int64)
    got = earlier_counts(hu, ht, ru, rt, cap)
    want = [min(cap, sum(1 for u, t in history if u == ru_ and t < rt_)) for ru_, rt_ in requests]
    assert got.tolist() == want


def test_cohort_codes() -> None:
    assert cohort_codes(np.array([0, 2, 3, 7]), 3).tolist() == [COLD_START] * 2 + [ESTABLISHED] * 2
