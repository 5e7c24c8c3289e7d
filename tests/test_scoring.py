import numpy as np
import pytest

from evaluator.core.propensity.models import PowerLaw
from evaluator.core.scoring import METRICS, ScoringConfig, score_requests, score_sparse


@pytest.mark.parametrize("propensity", [None, PowerLaw(1.0)])
def test_sparse_scoring_equals_dense(monkeypatch, propensity) -> None:
    from evaluator.core import scoring

    monkeypatch.setattr(scoring, "_CHUNK_CELLS", 500)  # force many chunks
    rng = np.random.default_rng(3)
    rows, width = 300, 120
    dense = np.zeros((rows, width))
    n = 900
    r = rng.integers(0, rows, n)
    p = np.minimum(rng.geometric(0.08, n) - 1, width - 1)
    g = rng.integers(0, 4, n).astype(float)
    np.maximum.at(dense, (r, p), g)
    config = ScoringConfig(ks=(1, 10, 200), **({"propensity": propensity} if propensity else {}))
    want = score_requests(dense, config)
    got = score_sparse(rows, r, p, g, config)
    for m in METRICS:
        np.testing.assert_allclose(got.values[m], want.values[m], atol=1e-12, err_msg=m)
    np.testing.assert_array_equal(got.engaged, want.engaged)


def test_adjusted_equals_raw_without_propensity() -> None:
    s = score_requests(np.array([[0.0, 2.0, 1.0]]), ScoringConfig(ks=(2,)))
    assert s.values["ndcg_adjusted"].tolist() == s.values["ndcg"].tolist()
    assert s.engaged.tolist() == [True]
