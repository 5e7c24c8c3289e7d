"""Binary-relevance metrics at cutoffs: MRR@K, HitRate@K, Precision@K, Recall@K.

An item is relevant when its grade is above zero. Precision@K divides by K even
when the list is shorter (as trec_eval's P_k does). Recall@K divides by the
number of relevant items shown in the whole list; it is 0 when there are none,
and callers decide whether such requests count (the zero-relevance policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from evaluator.core.metrics.spec import MetricSpec, Ranked

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class CutoffScores:
    """Per-request scores, each of shape ``(rows, len(ks))``."""

    mrr: FloatArray
    hit_rate: FloatArray
    precision: FloatArray
    recall: FloatArray


def cutoff_scores(grades: FloatArray, ks: Sequence[int]) -> CutoffScores:
    """MRR, hit rate, precision and recall at every cutoff in ``ks``."""
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"cutoffs must be positive integers, got {list(ks)}")
    relevant = np.asarray(grades) > 0
    rows, width = relevant.shape
    max_k = max(ks)
    # nothing lies beyond the lists' width: memory is linear in min(K, width), not K
    take = min(max_k, width)
    top = relevant[:, :take]

    karr = np.asarray(ks)
    if take:
        hits = np.cumsum(top, axis=1, dtype=np.int64)[:, np.minimum(karr, take) - 1]
    else:
        hits = np.zeros((rows, karr.size), dtype=np.int64)
    first = np.where(top.any(axis=1), top.argmax(axis=1), max_k) if take else np.full(rows, max_k)
    mrr = np.where(first[:, None] < karr[None, :], 1.0 / (first[:, None] + 1.0), 0.0)
    total = relevant.sum(axis=1, dtype=np.int64)[:, None]
    recall = np.zeros(hits.shape, dtype=np.float64)
    np.divide(hits, total, out=recall, where=total > 0)
    return CutoffScores(
        mrr=mrr,
        hit_rate=(hits > 0).astype(np.float64),
        precision=hits / karr[None, :].astype(np.float64),
        recall=recall,
    )


def _cut(ranked: Ranked) -> CutoffScores:
    return ranked.shared("cutoffs", lambda: cutoff_scores(ranked.grades, ranked.ks))


MRR = MetricSpec(
    "mrr", lambda r: _cut(r).mrr, "MRR", "recsys_eval_mrr", "Mean MRR@K in the window."
)
HIT_RATE = MetricSpec(
    "hit_rate",
    lambda r: _cut(r).hit_rate,
    "Hit",
    "recsys_eval_hit_rate",
    "HitRate@K in the window.",
)
PRECISION = MetricSpec(
    "precision",
    lambda r: _cut(r).precision,
    "P",
    "recsys_eval_precision",
    "Mean Precision@K (relevant items in the top K over K) in the window.",
    table=False,
)
RECALL = MetricSpec(
    "recall",
    lambda r: _cut(r).recall,
    "R",
    "recsys_eval_recall",
    "Mean Recall@K (relevant items in the top K over those in the whole list) in the window.",
    table=False,
)
