"""Composite score: a configured weighted sum of per-variant metric values."""

from __future__ import annotations

from collections.abc import Mapping


def composite_score(values: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Sum of ``weights[name] * values[name]``, e.g. 0.7·ndcg@10 + 0.2·coverage + 0.1·diversity.

    A weighted metric that is missing or NaN makes the score NaN rather than
    silently dropping a term.
    """
    total = 0.0
    for name, weight in weights.items():
        value = values.get(name, float("nan"))
        total += weight * value
    return total
