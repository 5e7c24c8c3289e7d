"""Overlap of two rankings: Jaccard@K and rank-biased overlap (RBO)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def jaccard_at_k(a: Sequence[str], b: Sequence[str], k: int) -> float:
    """|A ∩ B| / |A ∪ B| of the two top-k sets; 1 when both are empty."""
    top_a, top_b = set(a[:k]), set(b[:k])
    union = top_a | top_b
    return len(top_a & top_b) / len(union) if union else 1.0


def rbo(a: Sequence[Hashable], b: Sequence[Hashable], p: float = 0.9) -> float:
    """Extrapolated rank-biased overlap (Webber, Moffat & Zobel 2010, eq. 32).

    Handles lists of different lengths; identical lists score 1, disjoint ones 0.
    ``p`` sets how steeply the weight falls with depth (0.9: the top 10 ranks
    carry about 86% of it).
    """
    if not 0 < p < 1:
        raise ValueError(f"RBO p must be in (0, 1), got {p}")
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    s, ln = len(short), len(long_)
    if s == 0:
        return 1.0 if ln == 0 else 0.0
    seen_s: set[Hashable] = set()
    seen_l: set[Hashable] = set()
    overlap = 0
    total = 0.0
    x_s = 0
    for d in range(1, ln + 1):
        item_l = long_[d - 1]
        if d <= s:
            item_s = short[d - 1]
            if item_s == item_l:
                overlap += 1
            else:
                overlap += (item_s in seen_l) + (item_l in seen_s)
            seen_s.add(item_s)
        elif item_l in seen_s:
            overlap += 1
        seen_l.add(item_l)
        total += overlap / d * p**d
        if d == s:
            x_s = overlap
        if d > s:
            total += x_s * (d - s) / (s * d) * p**d
    return (1 - p) / p * total + ((overlap - x_s) / ln + x_s / s) * p**ln
