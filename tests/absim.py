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
    covariate: bool = False
    """Give users a pre-exposure covariate (:func:`covariate_of`) and read CUPED too."""


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


def covariate_of(
    rng: np.random.Generator, data: tuple[np.ndarray, ...], lift: float = 0.0
) -> tuple[np.ndarray, ...]:
    """A pre-exposure covariate per user: the mean nDCG of their requests in a
    pre-period of the same length, drawn from the same user effects (activity, as
    the negative binomial's gamma mixing given the in-experiment requests; engagement
    and nDCG level of engaged requests). Users with no pre-period request have none
    (as new users). The treatment's ``lift`` is taken out first: the pre-period
    precedes exposure. Returns (value, has one)."""
    arm, _, requests, engaged, ndcg = data
    ndcg = ndcg - arm * lift * requests
    p = 3 / 10
    r = 3 * p / (1 - p)
    scale = (1 - p) / p
    activity = rng.gamma(r + requests, scale / (1 + scale))
    before = rng.poisson(activity)
    engage = engaged / requests
    level = np.where(engaged > 0, ndcg / np.maximum(engaged, 1), 0.7)
    pre_engaged = rng.binomial(before, np.clip(engage, 0.0, 1.0))
    noise = rng.normal(0.0, 0.2, requests.size) * np.sqrt(pre_engaged)
    pre_sum = np.clip(pre_engaged * np.clip(level, 0.0, 1.0) + noise, 0.0, None)
    has = before > 0
    return np.where(has, pre_sum / np.maximum(before, 1), 0.0), has.astype(np.float64)


def add_users(
    blocks: dict[str, np.ndarray], data: tuple[np.ndarray, ...], lo: int, hi: int
) -> None:
    """Add users ``lo:hi`` to the two arms' cumulative blocks (1 cohort, 128 buckets,
    4 columns, or 6 with the covariate's sum and users)."""
    arm, bucket, requests, engaged, ndcg, *covariate = (x[lo:hi] for x in data)
    for index, name in enumerate(("control", "treatment")):
        mine = arm == index
        b = bucket[mine]
        block = blocks[name]
        block[0, :, 0] += np.bincount(b, requests[mine], BUCKETS)
        block[0, :, 1] += np.bincount(b, engaged[mine], BUCKETS)
        block[0, :, 2] += np.bincount(b, ndcg[mine], BUCKETS)
        block[0, :, 3] = block[0, :, 2]
        if covariate:
            value, has = covariate
            block[0, :, 4] += np.bincount(b, value[mine] * has[mine], BUCKETS)
            block[0, :, 5] += np.bincount(b, has[mine], BUCKETS)


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
    cuped_flagged: bool = False
    cuped_missed: bool = False
    """Some ready look's CUPED interval excluded the true difference."""
    cuped_lower: float = float("nan")
    cuped_upper: float = float("nan")
    reduction: float = float("nan")


def run(seed: int, traffic: Traffic, looks: int = 50, rules: ReadoutRules | None = None) -> Run:
    rng = np.random.default_rng(seed)
    data = users_of(rng, traffic)
    width = 4
    if traffic.covariate:  # drawn after the users: the same users as without it
        data = (*data, *covariate_of(np.random.default_rng(seed + 1_000_003), data, traffic.lift))
        width = 6
    rules = rules or ReadoutRules((K,), COLUMNS, covariate=(4, 5) if traffic.covariate else None)
    experiment = Experiment("sim", control="control")
    tracker = SequentialTracker()
    flagged = crossed = False
    ready = 0
    lower = upper = float("nan")
    out = Run(False, False, 0, lower, upper)
    blocks = {name: np.zeros((1, BUCKETS, width)) for name in ("control", "treatment")}
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
        if readout.cuped:
            cuped = next(c for c in readout.cuped if c.adjusted == "false")
            out.cuped_lower, out.cuped_upper = cuped.lower, cuped.upper
            out.reduction = cuped.reduction
            out.cuped_flagged |= cuped.lower > 0 or cuped.upper < 0
            out.cuped_missed |= not cuped.lower <= traffic.lift <= cuped.upper
            crossed |= cuped.lower > cuped.upper
    out.flagged, out.crossed, out.ready_looks = flagged, crossed, ready
    out.final_lower, out.final_upper = lower, upper
    return out
