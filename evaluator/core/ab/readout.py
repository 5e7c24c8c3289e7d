"""The A/B readout of an experiment, from its cumulative statistics (pure).

Input: per variant, the experiment's cumulative block ``(cohort, user bucket,
row)`` since its start (see :mod:`evaluator.core.experiments`), and the exact number
of users exposed per variant. Output: per (variant, K, adjusted) the nDCG
difference to the control with its always-valid interval, both p-values, and
per experiment the sample-ratio test on users.

Inference is withheld (interval and p-values NaN, ``ready`` False with a
reason) while it would not be trustworthy: before ``min_users`` exposed users in
the arm and in the control, or while the arm's requests sit in fewer than
``min_effective_buckets`` effective user buckets — a handful of heavy users
then carries the variance estimate, which comes out too small. Only ready looks
enter the running intersection of intervals, so an exclusion is never locked in
from an unreliable look. The mean is one definition for the gauges and the
difference: metric sum over all requests (``zero_relevance = "count"``) or
over engaged requests (``"skip"``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.cuped import Moments, adjust, moments
from evaluator.core.ab.interleaving import is_pair, rankers
from evaluator.core.ab.stats import (
    RatioEstimate,
    SequentialTracker,
    fixed_horizon,
    holm,
    ratio_estimate,
    sequential,
    srm_p_value,
    srm_sequential_p_value,
)
from evaluator.core.aggregate import denominator_column
from evaluator.core.experiments import Experiment

FloatArray = npt.NDArray[np.float64]

ADJUSTED = {"false": "ndcg", "true": "ndcg_adjusted"}
"""The ``adjusted`` label -> the metric compared."""


def effective_buckets(counts: FloatArray) -> float:
    """(Σ n_b)² / Σ n_b²: how many equally filled user buckets the requests amount to."""
    total = float(counts.sum())
    squares = float(counts @ counts)
    return total * total / squares if squares else 0.0


@dataclass(frozen=True, slots=True)
class ReadoutRules:
    """How an experiment is read (from ``ab.*`` and ``metrics.zero_relevance``)."""

    ks: tuple[int, ...]
    columns: Mapping[tuple[str, int], int]
    """(metric, k) -> row column of its sum."""
    zero_relevance: str = "count"
    alpha: float = 0.05
    tuning: float = 5000.0
    min_users: int = 1000
    min_effective_buckets: float = 16.0
    denominators: Mapping[tuple[str, int], int] | None = None
    """(metric, k) -> row column its mean divides by, when not the layout's first
    requests (a metric added to stored state later: :mod:`evaluator.core.rows`)."""
    covariate: tuple[int, int] | None = None
    """Row columns of the CUPED covariate's sum and of the users it covers (None: no
    CUPED readout; :mod:`evaluator.core.ab.cuped`)."""
    interleaving: tuple[int, int, int] | None = None
    """Row columns of a ranker pair's outcome sum, informative requests and the second
    ranker's wins (None: no interleaving readout; :mod:`evaluator.core.ab.interleaving`)."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """One variant against the control, for one K and one metric."""

    variant: str
    control: str
    k: int
    adjusted: str
    diff: float
    lower: float
    upper: float
    lift: tuple[float, float, float]
    p_sequential: float
    p_fixed: float
    ready: bool
    reason: str
    """Why inference is withheld ("" when ready)."""
    p_holm: float = math.nan
    """``p_sequential`` adjusted by Holm over the experiment's arms (same K and metric):
    the one to watch with several arms against one control."""
    reduction: float = math.nan
    """CUPED only: the share of the difference's variance the covariate removed."""


@dataclass(frozen=True, slots=True)
class PairReadout:
    """Team-draft interleaving of two rankers (names in sorted order): the preference
    for the second, Δ in [-1, 1] (wins minus losses over informative requests), its
    always-valid interval and p-values against 0, and the second's share of the
    decided requests."""

    first: str
    second: str
    preference: float
    lower: float
    upper: float
    p_sequential: float
    p_fixed: float
    share_second: float
    requests: float
    """Informative requests (a relevant interaction credited to a team)."""
    ready: bool
    reason: str


@dataclass(slots=True)
class ExperimentReadout:
    name: str
    control: str
    users: dict[str, int]
    requests: dict[str, float]
    srm_p_sequential: float
    """Always valid (:func:`srm_sequential_p_value`): what the exported series and the
    alert use."""
    srm_p_fixed: float
    """Chi-square, valid for one look (a whole file's replay)."""
    comparisons: list[Comparison] = field(default_factory=list)
    cuped: list[Comparison] = field(default_factory=list)
    """The same comparisons adjusted by the pre-exposure covariate (CUPED), when the
    rules name its columns."""
    overlap: dict[tuple[str, int], float] = field(default_factory=dict)
    """Jaccard@K of each variant's and the control's recommended items, by (variant, K),
    where the reader has the item sets (replay; live it is per window)."""
    interleaving: list[PairReadout] = field(default_factory=list)
    """Each ranker pair interleaved in the experiment's lists."""


def _estimate(per_bucket: FloatArray, col: int, denom: int) -> RatioEstimate:
    return ratio_estimate(per_bucket[:, col], per_bucket[:, denom])


def _withheld(
    users: Mapping[str, int],
    arm: str,
    control: str,
    rules: ReadoutRules,
    buckets: Mapping[str, float],
) -> str:
    for name in (control, arm):
        if users.get(name, 0) < rules.min_users:
            return f"fewer than {rules.min_users} users in {name}"
    for name in (control, arm):
        if buckets[name] < rules.min_effective_buckets:
            return f"{name} is dominated by a few heavy users"
    return ""


def read_experiment(
    experiment: Experiment,
    blocks: Mapping[str, FloatArray],
    users: Mapping[str, int],
    rules: ReadoutRules,
    tracker: SequentialTracker,
) -> ExperimentReadout:
    """The readout of one experiment (see the module docstring); ``tracker`` keeps the
    running intersection per (experiment, variant, K, metric) across looks. Ranker
    pairs' blocks (keys of :func:`~evaluator.core.ab.interleaving.pair_key`) are read
    as interleaving, not as arms."""
    pairs = {k: b for k, b in blocks.items() if is_pair(k)}
    blocks = {k: b for k, b in blocks.items() if k not in pairs}
    control, others = experiment.arms(set(blocks) | set(users) | experiment.expected())
    per = {v: b.sum(axis=0) for v, b in blocks.items()}  # (user bucket, row)
    denom = denominator_column(rules.zero_relevance)
    arms = [control, *others] if control else []
    split = experiment.split
    weights = np.asarray([split.get(v, 0.0) for v in arms]) if split else None
    counts = np.asarray([float(users.get(v, 0)) for v in arms])
    out = ExperimentReadout(
        experiment.name,
        control,
        {v: int(users.get(v, 0)) for v in arms},
        {v: float(per[v][:, 0].sum()) if v in per else 0.0 for v in arms},
        srm_sequential_p_value(counts, weights) if len(arms) >= 2 else math.nan,
        srm_p_value(counts, weights) if len(arms) >= 2 else math.nan,
    )
    if rules.interleaving is not None:
        out.interleaving = [
            read_pair(experiment.name, key, block.sum(axis=0), rules, tracker)
            for key, block in sorted(pairs.items())
        ]
    if control not in per:
        return out
    buckets = {v: effective_buckets(b[:, denom]) for v, b in per.items()}
    for k in rules.ks:
        for adjusted, metric in ADJUSTED.items():
            col = rules.columns[(metric, k)]
            over = (rules.denominators or {}).get((metric, k), denom)
            c_est = _estimate(per[control], col, over)
            for variant in others:
                if variant in per:
                    reason = _withheld(users, variant, control, rules, buckets)
                    v_est = _estimate(per[variant], col, over)
                    key = (experiment.name, variant, control, str(k), adjusted)
                    out.comparisons.append(_compare(key, (c_est, v_est), rules, tracker, reason))
                    if rules.covariate is not None:
                        pair = (
                            _moments(per[control], col, over, rules.covariate),
                            _moments(per[variant], col, over, rules.covariate),
                        )
                        if pair[0].users + pair[1].users > 0:  # else no one has a covariate
                            out.cuped.append(_cuped(key, pair, rules, tracker, reason))
    out.comparisons = _with_holm(out.comparisons, len(others))
    out.cuped = _with_holm(out.cuped, len(others))
    return out


_NULL = RatioEstimate(0.0, 0.0, 0.0)
"""A preference of 0 as a known control (no variance, no observations)."""


def read_pair(
    experiment: str,
    key: str,
    per_bucket: FloatArray,
    rules: ReadoutRules,
    tracker: SequentialTracker,
) -> PairReadout:
    """One ranker pair's preference from its cumulative sums per user bucket (the
    interval is the running intersection over looks, key ``(experiment, pair)``)."""
    assert rules.interleaving is not None
    total, requests, wins = (per_bucket[:, c] for c in rules.interleaving)
    estimate = ratio_estimate(total, requests)
    second = float(wins.sum())
    decided = 2.0 * second - float(total.sum())  # wins of both: W2 + (W2 - Σ outcome)
    share = second / decided if decided > 0 else math.nan
    first_name, second_name = rankers(key)
    nan = math.nan
    reason = ""
    if effective_buckets(requests) < rules.min_effective_buckets:
        reason = "too few user buckets with informative requests"
    if reason or not math.isfinite(estimate.variance):
        reason = reason or "too few informative requests"
        mean = estimate.mean
        return PairReadout(
            first_name, second_name, mean, nan, nan, nan, nan, share, estimate.count, False, reason
        )
    seq = tracker.update(
        (experiment, key, "interleaving"), sequential(_NULL, estimate, rules.alpha, rules.tuning)
    )
    fixed = fixed_horizon(_NULL, estimate, rules.alpha)
    return PairReadout(
        first_name,
        second_name,
        seq.diff,
        seq.lower,
        seq.upper,
        seq.p_value,
        fixed.p_value,
        share,
        estimate.count,
        True,
        "",
    )


def _moments(per_bucket: FloatArray, col: int, denom: int, covariate: tuple[int, int]) -> Moments:
    x, u = covariate
    return moments(per_bucket[:, col], per_bucket[:, denom], per_bucket[:, x], per_bucket[:, u])


def _cuped(
    key: tuple[str, str, str, str, str],
    pair: tuple[Moments, Moments],
    rules: ReadoutRules,
    tracker: SequentialTracker,
    reason: str,
) -> Comparison:
    """The CUPED-adjusted comparison (its own running intersection: key + ``cuped``)."""
    adjusted = adjust(*pair)
    estimates = (adjusted.control, adjusted.variant)
    compared = _compare((*key, "cuped"), estimates, rules, tracker, reason)
    return dataclasses.replace(compared, reduction=adjusted.reduction)


def _with_holm(comparisons: list[Comparison], arms: int) -> list[Comparison]:
    """Each comparison with its Holm-adjusted p-value over the ``arms`` compared with
    the control for the same K and metric (an arm without data or inference yet counts
    as p = 1: the family is every arm of the experiment)."""
    families: dict[tuple[int, str], list[int]] = {}
    for i, c in enumerate(comparisons):
        families.setdefault((c.k, c.adjusted), []).append(i)
    out = list(comparisons)
    for members in families.values():
        p = [comparisons[i].p_sequential for i in members]
        p += [math.nan] * (arms - len(p))  # arms with no block yet
        for i, adjusted in zip(members, holm(p), strict=False):
            out[i] = dataclasses.replace(comparisons[i], p_holm=adjusted)
    return out


def _compare(
    key: tuple[str, ...],
    estimates: tuple[RatioEstimate, RatioEstimate],
    rules: ReadoutRules,
    tracker: SequentialTracker,
    reason: str,
) -> Comparison:
    """One comparison (``estimates``: control, variant). A non-empty ``reason``: the
    difference only, inference withheld and the look kept out of the intersection."""
    _, variant, control, k, adjusted = key[:5]
    c_est, v_est = estimates
    if reason:
        nan = math.nan
        diff = v_est.mean - c_est.mean
        return Comparison(
            variant,
            control,
            int(k),
            adjusted,
            diff,
            nan,
            nan,
            (nan, nan, nan),
            nan,
            nan,
            False,
            reason,
        )
    seq = tracker.update(key, sequential(c_est, v_est, rules.alpha, rules.tuning))
    fixed = fixed_horizon(c_est, v_est, rules.alpha)
    return Comparison(
        variant,
        control,
        int(k),
        adjusted,
        seq.diff,
        seq.lower,
        seq.upper,
        seq.lift(),
        seq.p_value,
        fixed.p_value,
        True,
        "",
    )
