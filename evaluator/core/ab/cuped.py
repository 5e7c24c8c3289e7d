"""CUPED: the A/B difference adjusted by a pre-exposure covariate (pure).

Deng, Xu, Kohavi & Walker (2013), "Improving the sensitivity of online controlled
experiments by utilizing pre-experiment data". Each arm's metric is the ratio
``R = ΣY / ΣN`` over user buckets (nDCG sum over requests); the covariate is the
per-user mean ``S = ΣX / ΣU`` of a value known before the user's exposure (``X``
summed over the ``U`` users that have one). Both are linearised per bucket by the
delta method, as :func:`evaluator.core.ab.stats.ratio_estimate` does:

    e_b = (Y_b − R N_b) / n̄,   f_b = (X_b − S U_b) / ū,

and the difference of ``R − θ S`` between two arms has the smallest variance at

    θ = (Cov_c(e, f) + Cov_v(e, f)) / (Var_c(f) + Var_v(f)).

Randomisation makes ``E[S_v − S_c] = 0`` (the covariate precedes exposure), so the
adjusted difference estimates the same effect with the variance the covariate
explains removed: ``1 − ρ²`` of it for a correlation ``ρ``. A user without a
covariate adds to neither ``X`` nor ``U``: their ``f`` term is 0, exactly as if
they had the covariate's mean. The adjusted estimates feed the same fixed and
always-valid tests as the unadjusted ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.stats import RatioEstimate

FloatArray = npt.NDArray[np.float64]

DAY_MS = 86_400_000


def count_day(days: list[int], day: int) -> None:
    """Add one relevant interaction on ``day`` to a user's activity (flat ``(day,
    count)`` pairs, days ascending; a day before the latest, as topics may deliver it,
    goes in its place)."""
    if days and days[-2] == day:
        days[-1] += 1
        return
    at = len(days)
    while at and days[at - 2] > day:
        at -= 2
    if at and days[at - 2] == day:
        days[at - 1] += 1
    else:
        days[at:at] = [day, 1]


def pre_exposure(days: Sequence[int], exposure_ms: int, lookback_days: int) -> int:
    """The covariate of a user exposed at ``exposure_ms``: their relevant interactions on
    the ``lookback_days`` whole days before the exposure's day (that day excluded, so
    nothing after the exposure counts, whatever order events arrive in)."""
    day = exposure_ms // DAY_MS
    return sum(days[i + 1] for i in range(0, len(days), 2) if day - lookback_days <= days[i] < day)


def pre_exposure_counts(
    exposed: Sequence[str],
    exposure_ms: npt.NDArray[np.int64],
    relevant_users: Sequence[str],
    relevant_ms: npt.NDArray[np.int64],
    lookback_days: int,
) -> npt.NDArray[np.int64]:
    """:func:`pre_exposure` of many users at once, from every relevant interaction
    (user, time) as columns: replay's covariates, equal to the live engine's."""
    codes: dict[str, int] = {}
    user = np.fromiter((codes.setdefault(u, len(codes)) for u in relevant_users), np.int64)
    mine = np.fromiter((codes.get(u, -1) for u in exposed), np.int64, len(exposed))
    shift = np.int64(1 << 24)  # days since 1970 stay far below 2**24
    keys = np.sort(user * shift + np.asarray(relevant_ms, dtype=np.int64) // DAY_MS)
    day = np.asarray(exposure_ms, dtype=np.int64) // DAY_MS
    upto = np.searchsorted(keys, mine * shift + day)
    since = np.searchsorted(keys, mine * shift + day - lookback_days)
    return np.where(mine >= 0, upto - since, 0).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Moments:
    """One arm's ratio metric and covariate, linearised over its user buckets."""

    metric: float
    """R = ΣY / ΣN."""
    covariate: float
    """S = ΣX / ΣU (NaN without covariate users)."""
    var_metric: float
    var_covariate: float
    cov: float
    count: float
    """ΣN: the observations behind the metric."""
    users: float
    """ΣU: the users with a covariate."""
    covered: float
    """ΣX: the covariate's sum (with ``users``, the pooled mean)."""


def moments(y: FloatArray, n: FloatArray, x: FloatArray, u: FloatArray) -> Moments:
    """Per-bucket sums (metric, its denominator, covariate, covariate users) -> the
    delta-method variances and covariance of ``R`` and ``S`` (NaN with fewer than two
    buckets)."""
    y, n, x, u = (np.asarray(a, dtype=np.float64) for a in (y, n, x, u))
    units = (n > 0) | (u > 0)
    total_n, total_u = float(n.sum()), float(u.sum())
    r = float(y.sum()) / total_n if total_n > 0 else math.nan
    s = float(x.sum()) / total_u if total_u > 0 else math.nan
    b = int(units.sum())
    if b < 2 or total_n <= 0:
        return Moments(r, s, math.nan, math.nan, math.nan, total_n, total_u, float(x.sum()))
    e = (y[units] - r * n[units]) / (total_n / b)
    f = (x[units] - s * u[units]) / (total_u / b) if total_u > 0 else np.zeros(b)
    scale = b * (b - 1)
    return Moments(
        r,
        s,
        float(e @ e) / scale,
        float(f @ f) / scale,
        float(e @ f) / scale,
        total_n,
        total_u,
        float(x.sum()),
    )


@dataclass(frozen=True, slots=True)
class Adjusted:
    """The control's and the variant's CUPED-adjusted estimates, and what it gained."""

    control: RatioEstimate
    variant: RatioEstimate
    theta: float
    reduction: float
    """1 − Var(adjusted difference) / Var(unadjusted difference): the share of the
    variance the covariate removed (0 when it has none to remove)."""


def adjust(control: Moments, variant: Moments) -> Adjusted:
    """Both arms adjusted with the θ that minimises the difference's variance; with no
    usable covariate (no users with one, no spread) θ is 0 and the estimates are the
    unadjusted ones."""
    var_f = control.var_covariate + variant.var_covariate
    cov = control.cov + variant.cov
    usable = math.isfinite(var_f) and var_f > 0 and math.isfinite(cov)
    theta = cov / var_f if usable else 0.0
    users = control.users + variant.users
    pooled = (control.covered + variant.covered) / users if users > 0 else 0.0

    def one(m: Moments) -> RatioEstimate:
        shift = m.covariate - pooled if m.users > 0 else 0.0
        var = m.var_metric
        if theta:
            var = var - 2 * theta * m.cov + theta * theta * m.var_covariate
        return RatioEstimate(m.metric - theta * shift, max(var, 0.0), m.count)

    c, v = one(control), one(variant)
    raw = control.var_metric + variant.var_metric
    reduction = 1 - (c.variance + v.variance) / raw if raw > 0 and math.isfinite(raw) else 0.0
    return Adjusted(c, v, theta, reduction)
