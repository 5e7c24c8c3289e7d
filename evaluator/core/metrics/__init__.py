"""Ranking metrics, vectorised over batches of requests.

Every function takes a ``grades`` matrix of shape ``(requests, positions)``: row
``r`` holds the graded relevance of the items shown in request ``r``, position 1
first, padded with zeros past the end of the list. Padding never changes a
result, so lists of different lengths share one matrix.
"""

from evaluator.core.metrics.cutoff import CutoffScores, cutoff_scores
from evaluator.core.metrics.ndcg import GainKind, dcg, ndcg

__all__ = ["CutoffScores", "GainKind", "cutoff_scores", "dcg", "ndcg"]
