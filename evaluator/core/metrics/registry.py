"""The registry of per-request metrics: adding one is its module plus one line here.

Order matters only for display; stored columns are named (:mod:`evaluator.core.rows`),
so a new metric is read beside state written before it existed.
"""

from __future__ import annotations

from evaluator.core.metrics import average_precision, cutoff, ndcg
from evaluator.core.metrics.spec import MetricSpec

REGISTRY: tuple[MetricSpec, ...] = (
    ndcg.NDCG,
    ndcg.NDCG_ADJUSTED,
    cutoff.MRR,
    cutoff.HIT_RATE,
    cutoff.PRECISION,
    cutoff.RECALL,
    average_precision.MAP,
)

METRICS = tuple(m.name for m in REGISTRY)
"""Names of the per-request metrics, in registry order."""
