"""nDCG@K with exponential or linear gain, optionally with per-position weights.

DCG@K = sum_{i<=K} gain(rel_i) / log2(i + 1). IDCG@K is the DCG of the shown
items' gains sorted in descending order and cut at K, so the metric measures how
well the shown list was ordered. With position weights ``w`` (inverse
propensities) each shown item's gain is multiplied by the weight of the position
it was shown at, and both DCG and IDCG use the weighted gains, so the value
stays in [0, 1]. The ideal order is by grade (what a perfect ranker would show),
each item keeping its weighted gain; sorting by weighted gain instead would let a
rare, heavily up-weighted click at a low position dominate the ideal, which
over-corrects (docs/semantics.md has the simulation behind this choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from evaluator.core.metrics.spec import GainKind, MetricSpec, Ranked

FloatArray = npt.NDArray[np.float64]


@lru_cache(maxsize=64)
def _discounts(width: int) -> FloatArray:
    d = 1.0 / np.log2(np.arange(2, width + 2, dtype=np.float64))
    d.setflags(write=False)
    return d


def gains(grades: FloatArray, kind: GainKind = "exponential") -> FloatArray:
    """Gain of each graded item: ``2**rel - 1`` (exponential) or ``rel`` (linear)."""
    if kind == "exponential":
        return np.exp2(grades) - 1.0
    if kind == "linear":
        return np.asarray(grades, dtype=np.float64)
    raise ValueError(f"unknown gain {kind!r}: use 'exponential' or 'linear'")


def _top_desc(values: FloatArray, width: int) -> FloatArray:
    """The ``width`` largest values of each row, in descending order."""
    n_cols = values.shape[1]
    if n_cols > 2 * width:
        part = -np.partition(-values, width - 1, axis=1)[:, :width]
        return -np.sort(-part, axis=1)
    return -np.sort(-values, axis=1)[:, :width]


def _cumulative_dcg(ordered_gains: FloatArray, ks: Sequence[int]) -> FloatArray:
    """DCG at each cutoff in ``ks`` for rows already in display order."""
    width = ordered_gains.shape[1]
    discounted = ordered_gains * _discounts(width)
    cumulative = np.cumsum(discounted, axis=1)
    cols = [min(k, width) - 1 for k in ks]
    return cumulative[:, cols]


def _check_ks(ks: Sequence[int]) -> None:
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"cutoffs must be positive integers, got {list(ks)}")


def dcg(
    grades: FloatArray,
    ks: Sequence[int],
    gain: GainKind = "exponential",
    weights: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """DCG@K and IDCG@K for every row and cutoff; both of shape ``(rows, len(ks))``.

    ``weights``, when given, has one entry per position (at least as many as the
    matrix has columns) and multiplies the gain of the item shown there.
    """
    _check_ks(ks)
    grades = np.asarray(grades, dtype=np.float64)
    if grades.ndim != 2:
        raise ValueError("grades must be a 2-D matrix (requests x positions)")
    if grades.shape[1] == 0:
        zeros = np.zeros((grades.shape[0], len(ks)))
        return zeros, zeros.copy()
    g = gains(grades, gain)
    max_k = min(max(ks), g.shape[1])
    if weights is None:
        return _cumulative_dcg(g[:, :max_k], ks), _cumulative_dcg(_top_desc(g, max_k), ks)
    weighted = g * np.asarray(weights, dtype=np.float64)[: g.shape[1]]
    order = np.argsort(-g, axis=1, kind="stable")[:, :max_k]
    actual = _cumulative_dcg(weighted[:, :max_k], ks)
    ideal = _cumulative_dcg(np.take_along_axis(weighted, order, axis=1), ks)
    return actual, ideal


def ndcg(
    grades: FloatArray,
    ks: Sequence[int],
    gain: GainKind = "exponential",
    weights: FloatArray | None = None,
) -> FloatArray:
    """nDCG@K of shape ``(rows, len(ks))``; rows without a relevant item score 0."""
    actual, ideal = dcg(grades, ks, gain, weights)
    out = np.zeros_like(actual)
    np.divide(actual, ideal, out=out, where=ideal > 0)
    # Guard the last ulp: DCG can exceed IDCG by rounding when they are equal.
    return np.minimum(out, 1.0, out=out)


def _ndcg_of(ranked: Ranked, weighted: bool) -> FloatArray:
    if weighted and ranked.weights is not None:
        return ndcg(ranked.grades, ranked.ks, ranked.gain, ranked.weights)
    return ranked.shared("ndcg", lambda: ndcg(ranked.grades, ranked.ks, ranked.gain))


_HELP = "Mean nDCG@K over requests finalised in the window."
NDCG = MetricSpec(
    "ndcg",
    lambda r: _ndcg_of(r, False),
    "nDCG",
    "recsys_eval_ndcg",
    _HELP,
    (("adjusted", "false"),),
)
NDCG_ADJUSTED = MetricSpec(
    "ndcg_adjusted",
    lambda r: _ndcg_of(r, True),
    "adj",
    "recsys_eval_ndcg",
    _HELP,
    (("adjusted", "true"),),
)
"""nDCG with each position's gain weighted by its inverse propensity (equal to
:data:`NDCG` without a position-bias model)."""
