"""Simulated user-randomised experiments, read the way the exporter reads them.

Independent of the evaluator's code: users are split between two arms by a coin,
make an overdispersed number of requests (negative binomial, mean 3, variance
10; optionally 0.5% heavy users with 100 to 10,000 requests), and have their own
engagement rate and their own nDCG level (per-user effects, many requests with
no relevant item). Each look sums the users arrived so far into 128 user buckets
per arm, as the cumulative experiment blocks hold them, and hands them to
:func:`evaluator.core.ab.readout.read_experiment` (the exporter's own readout).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluator.core.ab.readout import ReadoutRules, read_experiment
from evaluator.core.ab.stats import SequentialTracker
from evaluator.core.experiments import Experiment

BUCKETS = 128
K = 10
COLUMNS = {("ndcg", K): 2, ("ndcg_adjusted", K): 3}
"""Rows of the simulated blocks: count, engaged, nDCG sum, adjusted nDCG sum."""


@dataclass(frozen=True)
class Traffic:
    users: int = 8_000
    """Users over both arms by the last look."""
    base: float = 0.35
    """Mean nDCG per request (zero-relevance requests included)."""
    lift: float = 0.0
    """Added to the treatment's per-request mean (0: an A/A test)."""
    heavy: float = 0.0
    """Share of heavy users (100 to 10,000 requests, log-uniform)."""
    treatment_share: float = 0.5


def users_of(rng: np.random.Generator, traffic: Traffic) -> tuple[np.ndarray, ...]:
    """Per user in arrival order: arm (0 control, 1 treatment), bucket, requests,
    engaged requests and nDCG sum."""
    n = traffic.users
    arm = (rng.random(n) < traffic.treatment_share).astype(np.int64)
    bucket = rng.integers(0, BUCKETS, n)
    # negative binomial with mean 3 and variance 10, at least one request
    p = 3 / 10
    r = 3 * p / (1 - p)
    requests = np.maximum(1, rng.negative_binomial(r, p, n))
    if traffic.heavy:
        heavy = rng.random(n) < traffic.heavy
        requests[heavy] = np.exp(rng.uniform(np.log(100), np.log(10_000), heavy.sum())).astype(int)
    # per-user effects: engagement rate and nDCG level of engaged requests
    engage = rng.beta(2.0, 2.0, n)  # mean 0.5: half the requests have no relevant item
    level = np.clip(rng.normal(0.7, 0.15, n), 0.05, 1.0)  # mean nDCG of engaged requests
    engaged = rng.binomial(requests, engage)
    noise = rng.normal(0.0, 0.2, n) * np.sqrt(engaged)
    ndcg = np.clip(engaged * level + noise, 0.0, engaged.astype(float))
    # the lift: the treatment's per-request mean moves by `lift`
    ndcg = ndcg + arm * traffic.lift * requests
    return arm, bucket, requests, engaged, ndcg


def add_users(
    blocks: dict[str, np.ndarray], data: tuple[np.ndarray, ...], lo: int, hi: int
) -> None:
    """Add users ``lo:hi`` to the two arms' cumulative blocks (1 cohort, 128 buckets,
    4 columns)."""
    arm, bucket, requests, engaged, ndcg = (x[lo:hi] for x in data)
    for index, name in enumerate(("control", "treatment")):
        mine = arm == index
        b = bucket[mine]
        block = blocks[name]
        block[0, :, 0] += np.bincount(b, requests[mine], BUCKETS)
        block[0, :, 1] += np.bincount(b, engaged[mine], BUCKETS)
        block[0, :, 2] += np.bincount(b, ndcg[mine], BUCKETS)
        block[0, :, 3] = block[0, :, 2]


@dataclass
class Run:
    """What one simulated experiment showed over its looks."""

    flagged: bool
    """Some look's always-valid interval excluded 0."""
    crossed: bool
    """Some look exported a lower bound above its upper bound."""
    ready_looks: int
    final_lower: float
    final_upper: float


def run(seed: int, traffic: Traffic, looks: int = 50, rules: ReadoutRules | None = None) -> Run:
    rng = np.random.default_rng(seed)
    data = users_of(rng, traffic)
    rules = rules or ReadoutRules((K,), COLUMNS)
    experiment = Experiment("sim", control="control")
    tracker = SequentialTracker()
    flagged = crossed = False
    ready = 0
    lower = upper = float("nan")
    blocks = {name: np.zeros((1, BUCKETS, 4)) for name in ("control", "treatment")}
    treated = np.cumsum(data[0])
    done = 0
    for j in range(1, looks + 1):
        upto = traffic.users * j // looks
        add_users(blocks, data, done, upto)
        done = upto
        users = {"control": upto - int(treated[upto - 1]), "treatment": int(treated[upto - 1])}
        readout = read_experiment(experiment, blocks, users, rules, tracker)
        raw = next(c for c in readout.comparisons if c.adjusted == "false")
        if not raw.ready:
            continue
        ready += 1
        lower, upper = raw.lower, raw.upper
        flagged |= lower > 0 or upper < 0
        crossed |= lower > upper
    return Run(flagged, crossed, ready, lower, upper)
