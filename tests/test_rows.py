"""Named statistics-row columns: the fresh layout keeps the positions every earlier
version used, a stored layout grows by appending, and what cannot be read is refused."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from evaluator.config import load_settings
from evaluator.core.metrics.registry import METRICS
from evaluator.core.rows import RowSchema, fresh_columns, widen
from evaluator.core.scoring import ScoringConfig, score_requests
from evaluator.core.windows import LayoutRefusedError, contribution_rows, resume

PREVIOUS_RELEASE = (
    '{"buckets_per_window": 12, "ks": [10, 20], "metrics": ["ndcg", "ndcg_adjusted", "mrr", '
    '"hit_rate", "precision", "recall"], "shards": 3, "user_buckets": 129, "windows_ms": '
    "[300000, 3600000, 86400000]}"
)
"""``{P:meta}:layout`` as the release before named columns wrote it (3 partitions)."""
OLD_METRICS = ("ndcg", "ndcg_adjusted", "mrr", "hit_rate", "precision", "recall")


def _layout(**overrides):
    return load_settings(environ={}, overrides=overrides).layout(3)


def test_fresh_rows_keep_the_positions_of_every_earlier_version() -> None:
    """count, engaged, sums metric-major, squares, diversity counts and sums, RBO, then
    the CUPED covariate and a ranker pair's interleaving outcomes (zero in request rows)."""
    grades = np.array([[0.0, 3.0, 1.0], [0.0, 0.0, 0.0]])
    scores = score_requests(grades, ScoringConfig(ks=(1, 2)))
    diversity = np.array([[0.5, np.nan], [np.nan, 0.25]])
    overlap = np.array([0.7, np.nan])
    rows = contribution_rows(scores, diversity, overlap)
    names = fresh_columns((1, 2), METRICS)
    assert rows.shape == (2, len(names))
    values = np.hstack([scores.values[m] for m in METRICS])
    expected = np.hstack(
        [
            [[1.0], [1.0]],
            [[1.0], [0.0]],
            values,
            values**2,
            [[1.0, 0.0], [0.0, 1.0]],
            [[0.5, 0.0], [0.0, 0.25]],
            [[1.0], [0.0]],
            [[0.7], [0.0]],
            np.zeros((2, 2)),  # the CUPED covariate: added per user at exposure
            np.zeros((2, 3)),  # interleaving: in a ranker pair's block
        ]
    )
    np.testing.assert_array_equal(rows, expected)
    assert names[-5:] == ("cuped_x", "cuped_users", "il_sum", "il_requests", "il_wins")
    assert names[: 2 + len(OLD_METRICS) * 2][2:4] == ("sum:ndcg@1", "sum:ndcg@2")


def test_the_previous_release_layout_is_read_and_grown_by_name() -> None:
    layout = _layout()
    grown = resume(layout, PREVIOUS_RELEASE)
    old = fresh_columns((10, 20), OLD_METRICS)
    assert grown.column_names[: len(old)] == old
    new = [m for m in METRICS if m not in OLD_METRICS]
    if new:
        assert grown.column_names[len(old) : len(old) + 2] == ("count#1", "engaged#1")
    assert set(grown.column_names) >= set(layout.column_names)
    # written back and read again: nothing more to add
    assert resume(layout, grown.fingerprint()).column_names == grown.column_names
    assert resume(layout, None) == layout and resume(layout, "") == layout


def test_a_grown_metric_is_the_mean_over_the_requests_that_have_it() -> None:
    old = RowSchema(("count", "engaged", "sum:a@1", "sq:a@1"))
    wanted = RowSchema(("count", "engaged", "sum:a@1", "sum:b@1", "sq:a@1", "sq:b@1"))
    grown = old.grown(wanted)
    assert grown.names == (*old.names, "count#1", "engaged#1", "sum:b@1", "sq:b@1")
    assert grown.grown(wanted) is grown
    computed = np.array([[1.0, 1.0, 0.5, 0.8, 0.25, 0.64], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    new_rows = grown.assemble(wanted.names, computed)
    before = widen(np.array([[1.0, 1.0, 1.0, 1.0]] * 3), grown.width)  # 3 old requests
    total = np.vstack([before, new_rows])
    assert grown.mean(total, "a", 1, "count") == pytest.approx((3 + 0.5) / 5)
    assert grown.mean(total, "b", 1, "count") == pytest.approx(0.8 / 2)
    assert grown.mean(total, "b", 1, "skip") == pytest.approx(0.8 / 1)
    assert np.isnan(grown.mean(before, "b", 1, "count"))  # nothing since: no value
    with pytest.raises(ValueError, match="columns"):
        widen(np.zeros((2, 9)), 4)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"windows": {"user_buckets": 256}}, "windows.user_buckets"),
        ({"windows": {"sizes": ["5m", "1h"]}}, "windows.sizes"),
        ({"windows": {"buckets_per_window": 6}}, "windows.buckets_per_window"),
        ({"metrics": {"k": [10]}}, "metrics.k"),
    ],
)
def test_what_cannot_be_converted_is_refused_naming_it(overrides, named) -> None:
    with pytest.raises(LayoutRefusedError, match=named.replace(".", r"\.")):
        resume(_layout(**overrides), PREVIOUS_RELEASE)


def test_another_partition_count_is_refused() -> None:
    stored = json.loads(PREVIOUS_RELEASE)
    layout = dataclasses.replace(_layout(), shards=4, user_buckets=132)
    with pytest.raises(LayoutRefusedError, match="partition count"):
        resume(layout, json.dumps(stored))


def test_a_cutoff_added_later_is_grown_too() -> None:
    grown = resume(_layout(metrics={"k": [5, 10, 20]}), PREVIOUS_RELEASE)
    assert "sum:ndcg@5" in grown.column_names
    assert grown.schema.denominator("ndcg", 5, "count") == grown.schema.index("count#1")
    assert grown.schema.denominator("ndcg", 10, "count") == grown.schema.index("count")
