"""Clicks from a position-based model on many sparse query contexts (independent of the
estimators): the counters the evaluator keeps, built through its own ``increments``.

Each context has a pool of items with their own relevance (Beta distributed) and a
few requests; each request ranks the pool by a noisy relevance score and shows the
top ``positions``. A shown item is clicked with probability theta_k * relevance.
With the defaults, most (context, item) rows hold one to three impressions.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from evaluator.core.propensity.estimation import Observation, increments

POSITIONS = 10


def power_law(eta: float, positions: int = POSITIONS) -> np.ndarray:
    return np.arange(1, positions + 1, dtype=np.float64) ** -eta


def steps(positions: int = POSITIONS) -> np.ndarray:
    """A curve far from a power law: flat at the top, a cliff, then a plateau."""
    theta = np.array([1.0, 0.95, 0.9, 0.55, 0.5, 0.45, 0.42, 0.4, 0.25, 0.22])
    return theta[:positions]


def sparse_counters(
    seed: int,
    theta: np.ndarray,
    *,
    contexts: int = 3_000,
    pool: int = 14,
    requests: float = 3.0,
    top_ctr: float = 0.45,
) -> tuple[Counter[str], float]:
    """Summed counters of the simulated requests, and the median impressions per
    (context, item) row. ``top_ctr`` scales relevance (Beta(0.8, 1.2) x top_ctr / 0.4)."""
    rng = np.random.default_rng(seed)
    positions = theta.size
    counters: Counter[str] = Counter()
    per_row: Counter[tuple[int, int]] = Counter()
    observations = []
    for c in range(contexts):
        relevance = np.clip(rng.beta(0.8, 1.2, pool) * top_ctr / 0.4, 0, 1)
        for _ in range(1 + rng.poisson(requests - 1)):
            order = np.argsort(-(relevance + rng.normal(0, 0.25, pool)))[:positions]
            clicked = [k for k, i in enumerate(order) if rng.random() < theta[k] * relevance[i]]
            observations.append(Observation(f"q{c}", [f"i{i}" for i in order], clicked))
            for i in order:
                per_row[(c, int(i))] += 1
    counters.update(increments(observations, positions))
    return counters, float(np.median(list(per_row.values())))
