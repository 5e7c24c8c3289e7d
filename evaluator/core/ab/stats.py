"""A/B statistics from user-bucket sufficient statistics: fixed-horizon and always valid.

Randomisation is by user, so requests of one user are correlated; the unit of
analysis is the user bucket (users hashed into ``user_buckets``). A variant's
metric is a ratio of sums over buckets, ``R = Σ s_b / Σ n_b``, whose variance
comes from the delta method:

    Var(R) ≈ Σ_b (s_b − R n_b)² / (B (B − 1) n̄²),   n̄ = Σ n_b / B.

Two tests on the difference ``Δ = R_variant − R_control``:

* **fixed**: Welch's z-test, valid only if looked at once;
* **sequential**: an always-valid confidence sequence from the normal-mixture
  boundary (Howard et al. 2021; Waudby-Smith et al.), the form used by
  GrowthBook's sequential engine, with tuning parameter N* (default 5000): the
  sample size at which the interval is tightest. It stays valid however often it
  is looked at. :class:`SequentialTracker` keeps the running intersection of the
  intervals and the running minimum of the p-value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RatioEstimate:
    """A ratio-of-sums mean, its delta-method variance, and the observations behind it."""

    mean: float
    variance: float
    count: float


def ratio_estimate(sums: FloatArray, counts: FloatArray) -> RatioEstimate:
    """Mean and delta-method variance from per-bucket sums and counts (buckets = units)."""
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    total = float(counts.sum())
    if total <= 0:
        return RatioEstimate(math.nan, math.nan, 0.0)
    mean = float(sums.sum()) / total
    buckets = int(np.count_nonzero(counts))
    if buckets < 2:
        return RatioEstimate(mean, math.nan, total)
    n_bar = total / buckets
    resid = (sums - mean * counts)[counts > 0]
    variance = float(resid @ resid) / (buckets * (buckets - 1) * n_bar * n_bar)
    return RatioEstimate(mean, variance, total)


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@lru_cache(maxsize=64)
def _normal_ppf(p: float) -> float:
    """Inverse standard normal CDF by bisection on erfc (no SciPy needed)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1 - _normal_sf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True, slots=True)
class DiffResult:
    """Variant minus control, its interval, a p-value, and the relative lift's interval."""

    diff: float
    lower: float
    upper: float
    p_value: float
    control: float
    """The control's mean; relative lift = diff / control."""
    lift_lower: float = math.nan
    lift_upper: float = math.nan

    def lift(self) -> tuple[float, float, float]:
        """Relative lift and its bounds (NaN when the control mean is 0)."""
        if not self.control or not math.isfinite(self.control):
            return math.nan, math.nan, math.nan
        return self.diff / self.control, self.lift_lower, self.lift_upper


def _fieller(q: float, control: RatioEstimate, variant: RatioEstimate) -> tuple[float, float]:
    """Fieller's interval for the lift ``v/c − 1`` at the boundary ``q`` of the
    difference's test: the ratios ``ρ`` with ``(v − ρc)² ≤ q²(V_v + ρ²V_c)``. At ``ρ = 1``
    that is the difference's own test, so the lift's interval excludes 0 exactly when
    the difference's does (a delta-method interval around the lift does not: it is
    lopsided when the control's mean is uncertain). NaN when the control's mean is not
    clearly above 0 (the set is then unbounded)."""
    c, v = control.mean, variant.mean
    a = c * c - q * q * control.variance
    if not (math.isfinite(a) and a > 0):
        return math.nan, math.nan
    vc, vv = control.variance, variant.variance
    root = q * math.sqrt(max(0.0, c * c * vv + v * v * vc - q * q * vc * vv))
    return (v * c - root) / a - 1, (v * c + root) / a - 1


def _result(half: float, p: float, control: RatioEstimate, variant: RatioEstimate) -> DiffResult:
    """The result for an interval of half-width ``half`` around the difference, and the
    lift's interval for the same boundary (:func:`_fieller`): the control's mean is an
    estimate too (dividing the difference's bounds by it would ignore that)."""
    c, v = control.mean, variant.mean
    diff = v - c
    var = control.variance + variant.variance
    lift_bounds = (math.nan, math.nan)
    if math.isfinite(half) and var > 0:
        lift_bounds = _fieller(half / math.sqrt(var), control, variant)
    return DiffResult(diff, diff - half, diff + half, p, c, *lift_bounds)


def fixed_horizon(
    control: RatioEstimate, variant: RatioEstimate, alpha: float = 0.05
) -> DiffResult:
    """Welch z-test on the difference; valid for a single look only."""
    diff = variant.mean - control.mean
    se = math.sqrt(control.variance + variant.variance)
    if not math.isfinite(se) or se == 0:
        return _result(math.nan, math.nan, control, variant)
    p = 2 * _normal_sf(abs(diff) / se)
    return _result(_normal_ppf(1 - alpha / 2) * se, p, control, variant)


def mixture_rho(tuning: float, alpha: float) -> float:
    """Mixture scale that makes the boundary tightest at ``tuning`` observations."""
    la = -2 * math.log(alpha)
    return math.sqrt((la + math.log(la + 1)) / tuning)


def sequential(
    control: RatioEstimate, variant: RatioEstimate, alpha: float = 0.05, tuning: float = 5000.0
) -> DiffResult:
    """Always-valid interval and p-value for the difference (normal-mixture boundary).

    With ``n`` observations and ``V`` the variance of the difference, the
    per-observation variance is ``σ² = nV`` and the half-width is
    ``σ·sqrt(2(nρ²+1)/(n²ρ²) · ln(sqrt(nρ²+1)/α))``. The p-value is the
    reciprocal of the mixture likelihood ratio, capped at 1.
    """
    diff = variant.mean - control.mean
    n = control.count + variant.count
    var = control.variance + variant.variance
    if not (math.isfinite(var) and var > 0 and n > 0):
        return _result(math.nan, math.nan, control, variant)
    sigma2 = n * var
    rho2 = mixture_rho(tuning, alpha) ** 2
    growth = n * rho2 + 1
    half = math.sqrt(sigma2 * 2 * growth / (n * n * rho2) * math.log(math.sqrt(growth) / alpha))
    log_lr = n * n * rho2 * diff * diff / (2 * sigma2 * growth) - 0.5 * math.log(growth)
    p = 1.0 if log_lr <= 0 else min(1.0, math.exp(-log_lr))
    return _result(half, p, control, variant)


Bounds = tuple[float, float]


def _intersect(new: Bounds, old: Bounds | None) -> Bounds | None:
    """The running intersection with ``old``; None when they are disjoint: the sequence
    missed (an event of probability at most alpha), and the caller restarts from this
    look rather than show an empty interval."""
    if old is None:
        return new
    if max(new[0], old[0]) > min(new[1], old[1]):
        return None
    return max(new[0], old[0]), min(new[1], old[1])


class SequentialTracker:
    """Running intersection of always-valid intervals (of the difference and of the
    lift) and running minimum p-value, per key. Both intervals restart together (from
    the latest look) when either intersection would be empty, so that the lift's
    interval excludes 0 exactly when the difference's does."""

    def __init__(self) -> None:
        self._state: dict[tuple[str, ...], tuple[Bounds, float, Bounds | None]] = {}

    def update(self, key: tuple[str, ...], result: DiffResult) -> DiffResult:
        if not (math.isfinite(result.lower) and math.isfinite(result.upper)):
            return result
        fresh: Bounds | None = (result.lift_lower, result.lift_upper)
        if not (math.isfinite(result.lift_lower) and math.isfinite(result.lift_upper)):
            fresh = None
        old = self._state.get(key)
        state = (result.lower, result.upper), result.p_value, fresh
        if old is not None:
            bounds = _intersect(state[0], old[0])
            lift = (
                old[2] if fresh is None else fresh if old[2] is None else _intersect(fresh, old[2])
            )
            if bounds is not None and (lift is not None or fresh is None):
                state = bounds, min(result.p_value, old[1]), lift
        self._state[key] = state
        (lower, upper), p, lift = state
        lift_lower, lift_upper = lift or (math.nan, math.nan)
        return DiffResult(result.diff, lower, upper, p, result.control, lift_lower, lift_upper)


SRM_CONCENTRATION = 100.0
"""Concentration ``k`` of the Dirichlet mixture of :func:`srm_sequential_p_value` (prior
``k·share``, as in Lindon & Malek's examples). At an expected 50/50 split
(docs/statistics.md): an arm that gets no traffic is flagged at p < 0.001 after 45
users, a 55/45 split after a median of ~1,750 users, a 51/49 split after ~46,000
(``k`` = 1,000 would take ~40,000 for 51/49 but ~150 users for a starved arm)."""


def _srm_arms(
    counts: FloatArray, weights: FloatArray | None
) -> tuple[FloatArray, FloatArray] | float:
    """The counts and expected shares of the arms the split gives traffic, or the p-value
    itself: 0 when an arm the split gives no share has any count (that is a mismatch),
    NaN when fewer than two arms or no count."""
    counts = np.asarray(counts, dtype=np.float64)
    k = counts.size
    total = counts.sum()
    if k < 2 or total <= 0:
        return math.nan
    share = np.full(k, 1.0 / k) if weights is None else np.asarray(weights) / np.sum(weights)
    unexpected = share <= 0
    if (counts[unexpected] > 0).any():  # traffic to an arm the split gives none
        return 0.0
    if int((~unexpected).sum()) < 2:
        return math.nan
    return counts[~unexpected], share[~unexpected]


def srm_p_value(counts: FloatArray, weights: FloatArray | None = None) -> float:
    """Sample-ratio-mismatch chi-square test of counts against the expected split: valid
    for one look (a whole file's replay), not for a series watched as it grows."""
    arms = _srm_arms(counts, weights)
    if isinstance(arms, float):
        return arms
    counts, share = arms
    expected = counts.sum() * share
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    return _chi2_sf(chi2, counts.size - 1)


def srm_sequential_p_value(
    counts: FloatArray, weights: FloatArray | None = None, concentration: float = SRM_CONCENTRATION
) -> float:
    """Always-valid sample-ratio-mismatch p-value (Lindon & Malek 2022): the reciprocal
    of the Bayes factor of a Dirichlet(``concentration``·share) mixture against the
    expected split, capped at 1. Under the expected split the Bayes factor is a
    martingale as users arrive, so the chance that it *ever* crosses ``1/α`` is at most
    ``α`` (Ville's inequality): the exported series may be watched and alerted on
    continuously. It depends on the current counts only (no state across looks)."""
    arms = _srm_arms(counts, weights)
    if isinstance(arms, float):
        return arms
    counts, share = arms
    prior = concentration * share
    log_bf = (
        math.lgamma(float(prior.sum()))
        - math.lgamma(float(prior.sum() + counts.sum()))
        + sum(math.lgamma(a + x) - math.lgamma(a) for a, x in zip(prior, counts, strict=True))
        - float(counts @ np.log(share))
    )
    return 1.0 if log_bf <= 0 else math.exp(-log_bf)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979): family-wise error control over the
    hypotheses, under any dependence between them. Each input is a valid p-value at
    the moment it is read (an always-valid one stays so at any look), so the adjusted
    values are too. A NaN (no inference yet) counts as 1 among the hypotheses and
    stays NaN."""
    m = len(p_values)
    filled = [1.0 if math.isnan(p) else p for p in p_values]
    order = sorted(range(m), key=filled.__getitem__)
    adjusted = [math.nan] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * filled[i]))
        adjusted[i] = running
    return [math.nan if math.isnan(p) else a for p, a in zip(p_values, adjusted, strict=True)]


def _chi2_sf(x: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (regularised incomplete gamma, series)."""
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    if z > a + 1:  # continued fraction for the upper tail
        b, c, d = z + 1 - a, 1e300, 1 / (z + 1 - a)
        h = d
        for i in range(1, 300):
            an = -i * (i - a)
            b += 2
            d = an * d + b
            d = 1 / d if abs(d) > 1e-300 else 1e300
            c = b + an / c if abs(c) > 1e-300 else 1e-300
            h *= d * c
            if abs(d * c - 1) < 1e-15:
                break
        return math.exp(-z + a * math.log(z) - math.lgamma(a)) * h
    term = total = 1 / a
    for i in range(1, 500):
        term *= z / (a + i)
        total += term
        if term < total * 1e-16:
            break
    return max(0.0, 1 - math.exp(-z + a * math.log(z) - math.lgamma(a)) * total)
