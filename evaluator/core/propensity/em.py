"""The position-based click model fitted by EM when most (context, item) rows are sparse.

Model: P(click | row r, position k) = theta_k * gamma_r, theta_1 = 1. Fitting one
free gamma per row is the textbook EM, and it fails on sparse rows: with one or
two impressions per row, gamma_r absorbs the position effect (the incidental
parameter problem) and the fitted curve comes out far too flat. Here instead:

* rows shown at a single position are left out: their gamma explains their clicks
  whatever theta is, so they carry no information about theta;
* gamma is integrated out under a relevance distribution estimated from the data
  (a discrete distribution on a fixed grid, fitted by EM: nonparametric maximum
  likelihood), one distribution per *set of positions a row was shown at*. Ranking
  puts relevant items high, so rows seen at the top are more relevant than rows
  seen lower down; a relevance distribution shared by all rows would credit that
  difference to the positions. Within a set, the clicks' split between the
  positions identifies theta.

EM steps are accelerated with SQUAREM (Varadhan and Roland 2008). The intervals
come from the observed information (outer product of the per-row scores of log
theta): they reflect the fit's uncertainty, not only click counts. Pure numpy.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
GRID = np.asarray(1 / (1 + np.exp(-np.linspace(-6.0, 5.0, 32))))
"""Relevance values (0.0025 ... 0.993) the relevance distributions live on."""
CAP = 1.0 / float(GRID.max()) - 1e-9
"""theta_k stays below this, so theta_k * gamma < 1 on the whole grid."""


@dataclass(frozen=True, slots=True)
class _Rows:
    """Informative rows, identical ones merged (``weight`` of each), sorted by group."""

    shown: FloatArray
    clicks: FloatArray
    weight: FloatArray
    group: npt.NDArray[np.intp]
    starts: npt.NDArray[np.intp]
    """First row of each group."""
    signatures: npt.NDArray[np.int64]
    """Each group's set of positions (a bit mask)."""

    @classmethod
    def of(cls, shown: FloatArray, clicks: FloatArray) -> _Rows:
        k = shown.shape[1]
        both = np.hstack([shown, clicks]).astype(np.int64)
        unique, weight = _unique_rows(both)
        shown, clicks = unique[:, :k].astype(np.float64), unique[:, k:].astype(np.float64)
        keep = (shown > 0).sum(axis=1) >= 2
        shown, clicks, weight = shown[keep], clicks[keep], weight[keep].astype(np.float64)
        signature = ((shown > 0) * (1 << np.arange(k))).sum(axis=1)
        signatures, group = np.unique(signature, return_inverse=True)
        order = np.argsort(group, kind="stable")
        group = group[order]
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if group.size else group
        return cls(shown[order], clicks[order], weight[order], group, starts, signatures)


def _unique_rows(
    rows: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``np.unique(rows, axis=0, return_counts=True)`` (the same rows in the same
    lexicographic order) by a lexsort of the columns: ~3x faster on count rows."""
    if not rows.shape[0]:
        return rows, np.zeros(0, np.int64)
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    first = np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)]
    starts = np.flatnonzero(first)
    return ordered[starts], np.diff(np.r_[starts, rows.shape[0]])


class _Fit:
    """EM on one set of rows; parameters are (theta, per-group relevance weights)."""

    def __init__(self, rows: _Rows) -> None:
        self.rows = rows
        self.miss = rows.shown - rows.clicks
        self.row_clicks = rows.clicks.sum(axis=1)
        self.position_clicks = rows.weight @ rows.clicks
        self.group_weight = np.add.reduceat(rows.weight, rows.starts)
        self.free = (rows.weight @ rows.shown > 0) & (self.position_clicks > 0)
        self.free[0] = False

    def posterior(self, theta: FloatArray, pi: FloatArray) -> tuple[FloatArray, float]:
        """Each row's posterior over the relevance grid, and the log-likelihood."""
        log_miss = np.log(np.clip(1 - theta[:, None] * GRID[None, :], 1e-300, None))
        logw = (
            np.log(pi[self.rows.group])
            + self.row_clicks[:, None] * np.log(GRID)
            + (self.miss @ log_miss)
        )
        top = logw.max(axis=1, keepdims=True)
        w = np.exp(logw - top)
        total = w.sum(axis=1, keepdims=True)
        ll = self.rows.weight @ (np.log(total[:, 0]) + top[:, 0])
        ll += self.position_clicks[self.free] @ np.log(np.maximum(theta[self.free], 1e-300))
        return w / total, float(ll)

    def step(self, theta: FloatArray, w: FloatArray) -> tuple[FloatArray, FloatArray]:
        """One EM update from the posterior ``w`` at ``theta``."""
        wm = w * self.rows.weight[:, None]
        pi = np.add.reduceat(wm, self.rows.starts, axis=0) / self.group_weight[:, None]
        unclicked = wm.T @ self.miss  # (grid, position): expected non-clicks
        lo, hi = np.full(theta.size, 1e-6), np.full(theta.size, CAP)
        for _ in range(40):  # theta_k solves C_k / t = sum_g U_gk g / (1 - t g): bisection
            mid = (lo + hi) / 2
            excess = self.position_clicks / mid - (
                unclicked * (GRID[:, None] / (1 - mid[None, :] * GRID[:, None]))
            ).sum(axis=0)
            lo, hi = np.where(excess > 0, mid, lo), np.where(excess > 0, hi, mid)
        new = np.where(self.free, (lo + hi) / 2, theta)
        return new, np.maximum(pi, 1e-300)

    def std_errors(self, theta: FloatArray, w: FloatArray) -> FloatArray:
        """Standard errors of log theta_k from the outer product of per-row scores."""
        odds = theta[:, None] * GRID[None, :] / (1 - theta[:, None] * GRID[None, :])
        scores = (self.rows.clicks - self.miss * (w @ odds.T))[:, self.free]
        info = (scores * self.rows.weight[:, None]).T @ scores
        se = np.full(theta.size, np.nan)
        se[0] = 0.0
        with contextlib.suppress(np.linalg.LinAlgError):  # singular: no interval
            se[self.free] = np.sqrt(np.clip(np.diag(np.linalg.inv(info)), 0.0, None))
        return se


def _pack(theta: FloatArray, pi: FloatArray) -> FloatArray:
    return np.concatenate([np.log(theta), np.log(pi).ravel()])


def _unpack(x: FloatArray, k: int, groups: int) -> tuple[FloatArray, FloatArray]:
    theta = np.exp(np.minimum(x[:k], np.log(CAP)))  # an extrapolation may overshoot
    theta[0] = 1.0
    logs = x[k:].reshape(groups, GRID.size)
    pi = np.exp(logs - logs.max(axis=1, keepdims=True))
    return theta, np.maximum(pi / pi.sum(axis=1, keepdims=True), 1e-300)


def _run(
    fit: _Fit, theta: FloatArray, pi: FloatArray, iterations: int, tol: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """SQUAREM-accelerated EM from (theta, pi) until theta moves less than ``tol``;
    returns theta, pi and the rows' posteriors."""
    k, groups = theta.size, pi.shape[0]
    w, ll = fit.posterior(theta, pi)
    for _ in range(iterations):
        t1, p1 = fit.step(theta, w)
        t2, p2 = fit.step(t1, fit.posterior(t1, p1)[0])
        x0, x1, x2 = _pack(theta, pi), _pack(t1, p1), _pack(t2, p2)
        r, v = x1 - x0, x2 - 2 * x1 + x0
        alpha = min(-1.0, -float(np.linalg.norm(r) / np.linalg.norm(v))) if v.any() else -1.0
        ta, pa = _unpack(x0 - 2 * alpha * r + alpha * alpha * v, k, groups)
        t3, p3 = fit.step(ta, fit.posterior(ta, pa)[0])
        w3, ll3 = fit.posterior(t3, p3)
        if not np.isfinite(ll3) or ll3 < ll:  # the extrapolation overshot: plain EM steps
            t3, p3 = t2, p2
            w3, ll3 = fit.posterior(t3, p3)
        moved = float(np.abs(t3 - theta)[fit.free].max(initial=0.0))
        theta, pi, w, ll = t3, p3, w3, ll3
        if moved < tol:
            break
    return theta, pi, w


def _start(fit: _Fit, k: int) -> FloatArray:
    # positions shown but never clicked get ~0 (their MLE): their impressions then say
    # nothing about the rows' relevance
    theta = np.where(fit.free, 1.0 / np.arange(1, k + 1), 1e-6)
    theta[0] = 1.0
    return theta


FOLDS = 10
"""Groups of contexts left out in turn for the jackknife standard errors."""
T_FOLDS = 2.262
"""The 97.5% quantile of Student's t with FOLDS - 1 degrees of freedom."""


def fit_position_model(
    shown: FloatArray,
    clicks: FloatArray,
    folds: npt.NDArray[np.int64] | None = None,
    iterations: int = 200,
    tol: float = 3e-5,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """theta_k / theta_1, the standard error of its log (scaled to a 95% normal
    interval), and the clicks of the rows used, from (row, position) impression and
    click counts. Positions with no click in an informative row keep theta NaN.

    ``folds`` (0 .. FOLDS - 1 per row, by context): the standard errors come from a
    grouped jackknife over them, which covers the uncertainty of the fitted
    relevance distributions too; without, from the observed information only."""
    k = shown.shape[1]
    rows = _Rows.of(shown, clicks)
    theta = np.full(k, np.nan)
    theta[0] = 1.0
    if not rows.starts.size:
        return theta, np.where(np.arange(k) == 0, 0.0, np.nan), np.zeros(k)
    fit = _Fit(rows)
    if fit.position_clicks[0] <= 0:  # theta_1 = 1 anchors the curve: no clicks there, no fit
        return theta, np.where(np.arange(k) == 0, 0.0, np.nan), fit.position_clicks
    pi = np.full((rows.starts.size, GRID.size), 1.0 / GRID.size)
    theta, pi, w = _run(fit, _start(fit, k), pi, iterations, tol)
    se = fit.std_errors(theta, w)
    if folds is not None:
        se = _jackknife((shown, clicks, folds), (theta, pi, rows.signatures), fit.free, se)
    theta = np.where(fit.free | (np.arange(k) == 0), theta, np.nan)
    return theta, se, fit.position_clicks


def _jackknife(
    data: tuple[FloatArray, FloatArray, npt.NDArray[np.int64]],
    full: tuple[FloatArray, FloatArray, npt.NDArray[np.int64]],
    free: npt.NDArray[np.bool_],
    fallback: FloatArray,
) -> FloatArray:
    """Grouped-jackknife standard errors of log theta (``data``: shown, clicks, folds;
    each refit starts from the full fit), widened from Student's t with FOLDS - 1
    degrees of freedom to the normal quantile the intervals use; ``fallback`` where a
    fold cannot be refitted."""
    shown, clicks, folds = data
    theta, pi, signatures = full
    logs = []
    for f in range(FOLDS):
        keep = folds != f
        rows = _Rows.of(shown[keep], clicks[keep])
        if not rows.starts.size:
            return fallback
        sub = _Fit(rows)
        if not np.array_equal(sub.free, free):
            return fallback
        start = pi[np.searchsorted(signatures, rows.signatures).clip(0, len(signatures) - 1)]
        start = np.where(np.isin(rows.signatures, signatures)[:, None], start, 1.0 / GRID.size)
        refit, _, _ = _run(sub, theta.copy(), start, 60, 1e-4)
        logs.append(np.log(refit))
    spread = np.asarray(logs)
    se = np.sqrt((FOLDS - 1) / FOLDS * ((spread - spread.mean(axis=0)) ** 2).sum(axis=0))
    se *= T_FOLDS / 1.959963984540054
    se[0] = 0.0
    return np.where(free | (np.arange(se.size) == 0), se, np.nan)
