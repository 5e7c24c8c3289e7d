"""Ranking metrics, vectorised over batches of requests: one module per metric family,
each defining its :class:`~evaluator.core.metrics.spec.MetricSpec` beside its
computation, listed in :mod:`evaluator.core.metrics.registry`.

Every function takes a ``grades`` matrix of shape ``(requests, positions)``: row
``r`` holds the graded relevance of the items shown in request ``r``, position 1
first, padded with zeros past the end of the list. Padding never changes a
result, so lists of different lengths share one matrix.
"""
