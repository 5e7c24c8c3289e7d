"""MAP@K: average precision at a cutoff, as trec_eval's ``map_cut``.

Relevance is binary (grade above 0). AP@K of a request is the sum, over the
relevant items within the top K, of the precision at that item's rank, divided
by the relevant items of the whole shown list (not only the top K); 0 when the
list has none, and the zero-relevance policy decides whether such requests count.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from evaluator.core.metrics.spec import MetricSpec

FloatArray = npt.NDArray[np.float64]


def average_precision(grades: FloatArray, ks: Sequence[int]) -> FloatArray:
    """AP@K of shape ``(rows, len(ks))``."""
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"cutoffs must be positive integers, got {list(ks)}")
    relevant = np.asarray(grades) > 0
    rows, width = relevant.shape
    take = min(max(ks), width)  # nothing lies beyond the lists' width
    if not take:
        return np.zeros((rows, len(ks)))
    top = relevant[:, :take]
    hits = np.cumsum(top, axis=1, dtype=np.float64)
    precision_at_hits = np.where(top, hits / np.arange(1, take + 1), 0.0)
    summed = np.cumsum(precision_at_hits, axis=1)[:, np.minimum(ks, take) - 1]
    total = relevant.sum(axis=1, dtype=np.float64)[:, None]
    out = np.zeros_like(summed)
    np.divide(summed, total, out=out, where=total > 0)
    return out


MAP = MetricSpec(
    "map",
    lambda r: average_precision(r.grades, r.ks),
    "MAP",
    "recsys_eval_map",
    "Mean average precision@K (trec_eval map_cut) in the window.",
)
