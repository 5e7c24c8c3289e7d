"""nDCG (linear gain), precision, recall, reciprocal rank and MAP@K against trec_eval itself."""

import numpy as np
import pytest

from evaluator.core.metrics.average_precision import average_precision
from evaluator.core.metrics.cutoff import cutoff_scores
from evaluator.core.metrics.ndcg import ndcg

pytrec_eval = pytest.importorskip("pytrec_eval")


def trec_eval(grades: np.ndarray, lengths: np.ndarray, measures: set[str]) -> dict:
    qrels, run = {}, {}
    for q, (row, n) in enumerate(zip(grades, lengths, strict=True)):
        docs = {f"d{i}": int(row[i]) for i in range(n)}
        qrels[f"q{q}"] = docs  # judgements cover exactly the shown items
        run[f"q{q}"] = {f"d{i}": float(n - i) for i in range(n)}  # display order
    return pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_linear_ndcg_matches_trec_eval(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, width = 400, 40
    lengths = rng.integers(1, width + 1, size=n)
    grades = rng.integers(0, 4, size=(n, width)) * (rng.random((n, width)) < 0.3)
    grades = grades * (np.arange(width)[None, :] < lengths[:, None])
    engaged = grades.sum(axis=1) > 0
    ks = [1, 5, 10, 20, 30]
    got = ndcg(grades.astype(float), ks, gain="linear")
    ref = trec_eval(grades, lengths, {"ndcg_cut.1,5,10,20,30"})
    for q in np.flatnonzero(engaged):
        want = [ref[f"q{q}"][f"ndcg_cut_{k}"] for k in ks]
        np.testing.assert_allclose(got[q], want, rtol=0, atol=1e-9)


def test_cutoff_metrics_match_trec_eval() -> None:
    rng = np.random.default_rng(7)
    n, width = 300, 25
    lengths = rng.integers(1, width + 1, size=n)
    grades = rng.integers(0, 3, size=(n, width)) * (rng.random((n, width)) < 0.25)
    grades = grades * (np.arange(width)[None, :] < lengths[:, None])
    ks = [5, 10, 30]
    got = cutoff_scores(grades.astype(float), ks)
    ref = trec_eval(grades, lengths, {"P.5,10,30", "recall.5,10,30", "recip_rank"})
    for q in np.flatnonzero(grades.sum(axis=1) > 0):
        r = ref[f"q{q}"]
        np.testing.assert_allclose(got.precision[q], [r[f"P_{k}"] for k in ks], atol=1e-9)
        np.testing.assert_allclose(got.recall[q], [r[f"recall_{k}"] for k in ks], atol=1e-9)
        # trec_eval's recip_rank has no cutoff: equal to MRR@K at a K past the list end
        assert got.mrr[q, 2] == pytest.approx(r["recip_rank"], abs=1e-9)


@pytest.mark.parametrize("seed", [4, 5])
def test_average_precision_matches_trec_eval_map_cut(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, width = 300, 30
    lengths = rng.integers(1, width + 1, size=n)
    grades = rng.integers(0, 4, size=(n, width)) * (rng.random((n, width)) < 0.25)
    grades = grades * (np.arange(width)[None, :] < lengths[:, None])
    ks = [1, 5, 10, 20, 30]
    got = average_precision(grades.astype(float), ks)
    ref = trec_eval(grades, lengths, {"map_cut.1,5,10,20,30"})
    engaged = grades.sum(axis=1) > 0
    for q in np.flatnonzero(engaged):
        want = [ref[f"q{q}"][f"map_cut_{k}"] for k in ks]
        np.testing.assert_allclose(got[q], want, rtol=0, atol=1e-9)
    assert not got[~engaged].any()  # no relevant item: 0 (the policy decides if it counts)
    # past the matrix's width (a K longer than every list) equals the full list
    np.testing.assert_array_equal(average_precision(grades.astype(float), [50])[:, 0], got[:, 4])
