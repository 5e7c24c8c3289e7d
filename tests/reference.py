"""Straightforward, independent reference implementations used to check the vectorised core.

They follow the textbook definitions one list at a time and share no code with
``evaluator``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def gain(rel: float, kind: str) -> float:
    return 2.0**rel - 1.0 if kind == "exponential" else float(rel)


def dcg(gains: Sequence[float], k: int) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))


def ndcg(
    grades: Sequence[float],
    k: int,
    kind: str = "exponential",
    weights: Sequence[float] | None = None,
) -> float:
    gains = [gain(r, kind) for r in grades]
    if weights is None:
        ideal = dcg(sorted(gains, reverse=True), k)
        return dcg(gains, k) / ideal if ideal > 0 else 0.0
    weighted = [g * weights[i] for i, g in enumerate(gains)]
    # ideal order: by grade (ties in shown order), each item keeping its weighted gain
    order = sorted(range(len(gains)), key=lambda i: -gains[i])
    ideal = dcg([weighted[i] for i in order], k)
    return min(1.0, dcg(weighted, k) / ideal) if ideal > 0 else 0.0


def mrr(grades: Sequence[float], k: int) -> float:
    for i, r in enumerate(grades[:k]):
        if r > 0:
            return 1.0 / (i + 1)
    return 0.0


def hits(grades: Sequence[float], k: int) -> int:
    return sum(1 for r in grades[:k] if r > 0)


def recall(grades: Sequence[float], k: int) -> float:
    total = sum(1 for r in grades if r > 0)
    return hits(grades, k) / total if total else 0.0


def rbo_ext(a: Sequence[str], b: Sequence[str], p: float) -> float:
    """Webber et al. (2010) eq. 32, with overlaps taken by set intersection at each depth."""
    s_list, l_list = (a, b) if len(a) <= len(b) else (b, a)
    s, ln = len(s_list), len(l_list)

    def x(d: int) -> int:
        return len(set(s_list[: min(d, s)]) & set(l_list[:d]))

    total = sum(x(d) / d * p**d for d in range(1, ln + 1))
    total += sum(x(s) * (d - s) / (s * d) * p**d for d in range(s + 1, ln + 1))
    return (1 - p) / p * total + ((x(ln) - x(s)) / ln + x(s) / s) * p**ln


def srm_sequential_p(
    counts: Sequence[float], share: Sequence[float], concentration: float
) -> float:
    """The always-valid SRM p-value from scipy: 1 / (Dirichlet-multinomial probability
    of the counts over their multinomial probability under ``share``; the multinomial
    coefficients cancel), capped at 1."""
    import numpy as np
    from scipy import stats

    x = np.asarray(counts, dtype=np.int64)
    theta = np.asarray(share, dtype=np.float64) / float(np.sum(share))
    n = int(x.sum())
    log_bf = stats.dirichlet_multinomial.logpmf(x, concentration * theta, n) - (
        stats.multinomial.logpmf(x, n, theta)
    )
    return min(1.0, math.exp(-log_bf))
