"""Examination propensities estimated from clicks: pure statistics, no I/O.

Finalised requests become additive counters (:func:`increments`), which the
state store sums across batches, restarts and instances (each request is
claimed once, so nothing is double counted). Three estimators read them:

* ``randomized``: impressions whose top n was shuffled (``topn``) or whose
  positions 1 and k were swapped (``swap``). In a shuffled slice relevance is
  independent of position, so theta_k / theta_1 = CTR_k / CTR_1. In a swap the
  item ranked first is shown at k: theta_k / theta_1 = CTR(swapped item at k) /
  CTR(position 1 without randomisation).
* ``harvesting``: the pivot estimator of intervention harvesting. The same item
  in the same context shown at position 1 and at position k by different
  requests (for example by different variants) gives theta_k / theta_1 =
  sum_i w_i CTR_i(k) / sum_i w_i CTR_i(1), with w_i = n_i1 n_ik / (n_i1 + n_ik).
* ``em``: the position-based model P(click | context, item, k) = theta_k gamma
  fitted by expectation-maximisation on the (context, item, position) counts, with
  each row's relevance integrated out under a distribution estimated from the data
  (robust to rows of one or two impressions; see :mod:`evaluator.core.propensity.em`).

Every estimate comes with per-position sample sizes and approximate 95%
intervals (delta method on the log ratio), a fitted power law k ** -eta, and
falls back to that power law at positions with too few clicks.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from evaluator.core.propensity.em import FOLDS, fit_position_model

FloatArray = npt.NDArray[np.float64]
Estimator = Literal["randomized", "harvesting", "em"]
ESTIMATORS: tuple[Estimator, ...] = ("randomized", "harvesting", "em")

SEP = "\x1f"
CLICK = 1 << 32
"""A counter packs shown + clicks * 2**32, so one increment records both."""
Z95 = 1.959963984540054


@dataclass(frozen=True, slots=True)
class Observation:
    """One finalised request as the estimators see it."""

    context: str
    items: Sequence[str]
    clicked: Sequence[int]
    """0-based positions with a relevant interaction."""
    randomization: tuple[str, int] | None = None
    """``("topn", n)`` or ``("swap", k)``."""


def clicked_positions(
    requests: int, rows: Iterable[int], positions: Iterable[int], grades: Iterable[float]
) -> list[list[int]]:
    """Per request, the 0-based positions with a relevant (grade > 0) attributed interaction,
    from the join's ``(row, position, grade)`` entries (live and replay share this)."""
    clicked: list[list[int]] = [[] for _ in range(requests)]
    for row, pos, grade in zip(rows, positions, grades, strict=True):
        if grade > 0:
            clicked[row].append(pos)
    return clicked


DAY_MS = 86_400_000
"""Counters are kept per day of the requests' finalisation time."""


def counter_day(deadline_ms: int) -> int:
    """The day (start, epoch ms) whose counters a request finalised at ``deadline_ms`` adds to."""
    return deadline_ms - deadline_ms % DAY_MS


def first_kept_day(newest_day: int, history_ms: int) -> int:
    """Oldest day the estimators use: ``history_ms`` (whole days) ending with the newest."""
    return newest_day - ((history_ms - 1) // DAY_MS) * DAY_MS


def increments(observations: Sequence[Observation], positions: int) -> Counter[str]:
    """Counter increments for a batch of requests (additive, so batches can be merged)."""
    out: Counter[str] = Counter()
    for obs in observations:
        clicked = set(obs.clicked)
        top = min(positions, len(obs.items))
        for pos in range(top):
            key = f"h{SEP}{obs.context}{SEP}{obs.items[pos]}{SEP}{pos + 1}"
            out[key] += 1 + (CLICK if pos in clicked else 0)
        rnd = obs.randomization
        if rnd is None:
            out[f"r{SEP}base{SEP}1"] += 1 + (CLICK if 0 in clicked else 0)
        elif rnd[0] == "topn":
            for pos in range(min(rnd[1], top)):
                out[f"r{SEP}topn{SEP}{pos + 1}"] += 1 + (CLICK if pos in clicked else 0)
        elif rnd[0] == "swap" and 2 <= rnd[1] <= top:
            out[f"r{SEP}swap{SEP}{rnd[1]}"] += 1 + (CLICK if rnd[1] - 1 in clicked else 0)
    return out


def unpack(value: int) -> tuple[int, int]:
    """``(shown, clicks)`` of a packed counter."""
    return value & (CLICK - 1), value >> 32


@dataclass(frozen=True, slots=True)
class Tables:
    """Counters as arrays: randomised slices per position, and a (context, item) x
    position matrix of impressions and clicks."""

    topn: FloatArray
    """(2, positions): shown, clicks per position in shuffled slices."""
    swap: FloatArray
    """(2, positions): shown, clicks of the swapped item at position k (k >= 2)."""
    base: FloatArray
    """(2,): shown, clicks at position 1 without randomisation."""
    shown: FloatArray
    clicks: FloatArray
    folds: npt.NDArray[np.int64] | None = None
    """Per (context, item) row, its context's jackknife group (0 .. 9, a stable hash)."""


def tables(counters: Mapping[str, int], positions: int) -> Tables:
    """Parse summed counters into arrays; unknown or out-of-range keys are ignored."""
    topn, swap, base = np.zeros((2, positions)), np.zeros((2, positions)), np.zeros(2)
    rows: dict[str, int] = {}
    contexts: list[str] = []
    cells: list[tuple[int, int, int, int]] = []
    for key, value in counters.items():
        parts = key.split(SEP)
        shown, clicks = unpack(int(value))
        pos = int(parts[-1]) - 1
        if not 0 <= pos < positions:
            continue
        if parts[0] == "h" and len(parts) == 4:
            row = rows.setdefault(f"{parts[1]}{SEP}{parts[2]}", len(rows))
            if row == len(contexts):
                contexts.append(parts[1])
            cells.append((row, pos, shown, clicks))
        elif parts[0] == "r" and parts[1] == "topn":
            topn[:, pos] += (shown, clicks)
        elif parts[0] == "r" and parts[1] == "swap":
            swap[:, pos] += (shown, clicks)
        elif parts[0] == "r" and parts[1] == "base":
            base += (shown, clicks)
    shown_m, clicks_m = np.zeros((len(rows), positions)), np.zeros((len(rows), positions))
    if cells:
        arr = np.asarray(cells, dtype=np.int64)
        np.add.at(shown_m, (arr[:, 0], arr[:, 1]), arr[:, 2])
        np.add.at(clicks_m, (arr[:, 0], arr[:, 1]), arr[:, 3])
    folds = np.fromiter((zlib.crc32(c.encode()) % FOLDS for c in contexts), np.int64, len(contexts))
    return Tables(topn, swap, base, shown_m, clicks_m, folds)


@dataclass(frozen=True, slots=True)
class Estimate:
    """theta_k / theta_1 for k = 1..positions with what supports it."""

    estimator: str
    theta: FloatArray
    lower: FloatArray
    upper: FloatArray
    samples: FloatArray
    """Clicks behind each position's estimate."""
    eta: float
    """Fitted power law theta_k = k ** -eta (nan when nothing could be fitted)."""
    fallback: npt.NDArray[np.bool_]
    """Positions whose value is the fitted power law for lack of data."""

    def curve(self) -> tuple[float, ...] | None:
        """The curve to score with, or ``None`` while some position has no value."""
        if not np.isfinite(self.theta).all():
            return None
        return tuple(float(t) for t in self.theta)


def _ratio(
    num_c: FloatArray, num_n: FloatArray, den_c: FloatArray, den_n: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """CTR ratio and the standard error of its log (binomial delta method)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (num_c / num_n) / (den_c / den_n)
        se = np.sqrt(1 / num_c - 1 / num_n + 1 / den_c - 1 / den_n)
    return ratio, se


def fit_power_law(theta: FloatArray, se_log: FloatArray) -> float:
    """Weighted least squares of log theta_k = -eta log k through theta_1 = 1."""
    k = np.arange(1, theta.size + 1, dtype=np.float64)
    ok = np.isfinite(theta) & (theta > 0) & np.isfinite(se_log) & (se_log > 0) & (k > 1)
    if not ok.any():
        return float("nan")
    w = 1.0 / se_log[ok] ** 2
    x, y = np.log(k[ok]), np.log(theta[ok])
    return float(max(0.0, -(w * x * y).sum() / (w * x * x).sum()))


def _finish(
    name: str, theta: FloatArray, se_log: FloatArray, samples: FloatArray, min_clicks: int
) -> Estimate:
    theta, se_log = theta.copy(), se_log.copy()
    theta[0], se_log[0] = 1.0, 0.0
    eta = fit_power_law(theta, se_log)
    weak = (samples < min_clicks) | ~np.isfinite(theta) | (theta <= 0)
    weak[0] = False
    if np.isfinite(eta):
        theta[weak] = np.arange(1, theta.size + 1, dtype=np.float64)[weak] ** -eta
    else:
        theta[weak] = np.nan
    lower, upper = theta * np.exp(-Z95 * se_log), theta * np.exp(Z95 * se_log)
    lower[weak], upper[weak] = np.nan, np.nan
    return Estimate(name, theta, lower, upper, samples, eta, weak)


def randomized(t: Tables, min_clicks: int = 30) -> Estimate:
    """From shuffled slices when there are any, else from swaps."""
    if t.topn[1, 0] > 0:
        shown, clicks = t.topn
        theta, se = _ratio(clicks, shown, clicks[0], shown[0])
        return _finish("randomized", theta, se, clicks, min_clicks)
    shown, clicks = t.swap
    theta, se = _ratio(clicks, shown, t.base[1], t.base[0])
    samples = clicks.copy()
    samples[0] = t.base[1]
    return _finish("randomized", theta, se, samples, min_clicks)


def harvesting(t: Tables, min_clicks: int = 30) -> Estimate:
    """Pivot estimator with position 1 as the pivot, over (context, item) pairs seen at both."""
    n1, c1 = t.shown[:, :1], t.clicks[:, :1]
    both = (n1 > 0) & (t.shown > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(both, n1 * t.shown / (n1 + t.shown), 0.0)
        a = np.where(both, t.clicks / t.shown, 0.0)  # CTR at k
        b = np.where(both, c1 / n1, 0.0)  # CTR at 1, same pairs
        num, den = (w * a).sum(axis=0), (w * b).sum(axis=0)
        theta = num / den
        # the larger of two variances of log theta: with the pairs as the units (a ratio
        # of sums: each pair's residual w (a - theta b)), and the binomial variance of
        # each pair's CTRs through the ratio (the delta method). The binomial one alone
        # is 0 for the usual sparse pair (a CTR of 0 or 1 from one or two impressions):
        # its intervals covered the truth in a third of cases; the pairs' one alone is
        # 0 when a few well-sampled pairs happen to agree
        resid = np.where(both, w * (a - theta * b), 0.0)
        pairs = both.sum(axis=0)
        small = np.where(pairs > 1, pairs / np.maximum(pairs - 1, 1), np.nan)
        var_pairs = small * (resid**2).sum(axis=0) / num**2
        var_num = (w**2 * a * (1 - a) / np.where(both, t.shown, 1)).sum(axis=0)
        var_den = (w**2 * b * (1 - b) / np.where(both, n1, 1)).sum(axis=0)
        var_binomial = var_num / num**2 + var_den / den**2
        se_log = np.sqrt(np.fmax(var_pairs, var_binomial))
    samples = np.where(both, t.clicks, 0.0).sum(axis=0)
    return _finish("harvesting", theta, se_log, samples, min_clicks)


def em(
    t: Tables,
    min_clicks: int = 30,
    iterations: int = 200,
    tol: float = 3e-5,
    *,
    intervals: bool = True,
) -> Estimate:
    """The position-based model fitted on (context, item) x position counts, robust to
    sparse rows (see :mod:`evaluator.core.propensity.em`). ``intervals=False`` skips the
    jackknife (ten refits) when only the curve is needed: its bounds are then
    the observed-information ones."""
    folds = t.folds if intervals else None
    theta, se_log, clicks = fit_position_model(t.shown, t.clicks, folds, iterations, tol)
    return _finish("em", theta, se_log, clicks, min_clicks)


def estimate(
    counters: Mapping[str, int],
    estimator: Estimator,
    positions: int,
    min_clicks: int = 30,
    *,
    intervals: bool = True,
) -> Estimate:
    """The named estimator's curve from summed counters (``intervals``: see :func:`em`)."""
    t = tables(counters, positions)
    if estimator == "randomized":
        return randomized(t, min_clicks)
    if estimator == "harvesting":
        return harvesting(t, min_clicks)
    return em(t, min_clicks, intervals=intervals)


def estimate_all(
    counters: Mapping[str, int], positions: int, min_clicks: int = 30
) -> dict[str, Estimate]:
    t = tables(counters, positions)
    return {
        "randomized": randomized(t, min_clicks),
        "harvesting": harvesting(t, min_clicks),
        "em": em(t, min_clicks),
    }
