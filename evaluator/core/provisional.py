"""Provisional nDCG: the final value of requests still inside their attribution window,
estimated from the interactions seen so far (label maturity, Chapelle 2014). Pure.

At a fixed *age* after each impression (``regression.provisional_age``, default 2
minutes) the engine scores the request with the interactions that arrived by then
and adds it to a provisional history, slotted like the final one but by impression
time plus the age (plus clock skew and allowed lateness, as a deadline): provisional
slot ``s`` holds exactly the requests that final slot ``s + k`` will hold, ``k``
slots later (:attr:`RegressionRules.lead_slots`). Over the span's matched pairs of
slots the *maturity* is learnt: the share of the final mean nDCG that had arrived
by the age, ``m = (ΣP/Σn_p) / (ΣF/Σn_f)`` (a ratio of means). The estimate of a
young slot's final mean is then its partial mean over ``m``, with a prediction
band from the matched pairs' errors (robust: a median), so the detector sees a
drop minutes after it starts rather than after the attribution window.

Stored beside the final history under the variant's name behind :data:`PROVISIONAL`
(a character no identifier may hold).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from evaluator.core.scoring import RequestScores

FloatArray = npt.NDArray[np.float64]
PROVISIONAL = "\x1d"
"""Before a variant's name in the history: its provisional arrays."""
MATURITY = "\x1c"
"""Before a variant's name in the history: its maturity arrays
(:mod:`evaluator.core.maturity`). Events cannot hold either character."""
Z95 = 1.959963984540054


def provisional_name(variant: str) -> str:
    return PROVISIONAL + variant


def as_provisional(
    history: Mapping[tuple[int, str], FloatArray],
) -> dict[tuple[int, str], FloatArray]:
    """Arrays of scored-early requests, stored under their variants' provisional names."""
    return {(hour, PROVISIONAL + name): array for (hour, name), array in history.items()}


def split_history(
    history: Mapping[tuple[int, str], FloatArray],
) -> tuple[dict[tuple[int, str], FloatArray], dict[tuple[int, str], FloatArray]]:
    """The final arrays, and the provisional ones keyed by their variant's own name
    (other kinds, such as the maturity arrays, are left out)."""
    final: dict[tuple[int, str], FloatArray] = {}
    early: dict[tuple[int, str], FloatArray] = {}
    for (hour, name), array in history.items():
        if name.startswith(PROVISIONAL):
            early[(hour, name[len(PROVISIONAL) :])] = array
        elif not name.startswith(MATURITY):
            final[(hour, name)] = array
    return final, early


def score_rows(scores: RequestScores, ks: tuple[int, ...]) -> FloatArray:
    """Per request, what a history array sums: count, engaged, then per K nDCG@K and
    its square (the statistics rows' ``count``, ``engaged``, ``sum:`` and ``sq:``)."""
    n = len(scores.engaged)
    out = np.zeros((n, 2 + 2 * len(ks)))
    out[:, 0] = 1.0
    out[:, 1] = scores.engaged
    ndcg = scores.values["ndcg"]
    for i in range(len(ks)):
        out[:, 2 + 2 * i] = ndcg[:, i]
        out[:, 3 + 2 * i] = ndcg[:, i] * ndcg[:, i]  # as the statistics rows square it
    return out


@dataclass(frozen=True, slots=True)
class Estimate:
    """The last ``k`` final-time slots as the provisional data predict them."""

    mean: FloatArray
    """Each slot's estimated final mean (partial mean over the maturity)."""
    variance: FloatArray
    """Its variance as an estimate of the slot's expected nDCG (what a detector
    compares with a baseline): the partial mean's sampling variance over m²."""
    prediction: FloatArray
    """Its variance as a prediction of the slot's final mean (those requests' own
    interactions still to come): smaller, since final and partial share most."""
    n: FloatArray
    maturity: float
    partial: FloatArray
    """Each slot's observed partial mean."""

    def band(self) -> FloatArray:
        """Half-widths of the 95% prediction bands of the final means."""
        half: FloatArray = Z95 * np.sqrt(self.prediction)
        return half


def estimate(
    final: tuple[FloatArray, FloatArray],
    early: tuple[FloatArray, FloatArray, FloatArray],
    span: int,
    lead: int,
    min_requests: int,
) -> Estimate | None:
    """From the final (requests, sum) and provisional (requests, sum, sum of squares)
    per slot on the same time axis (provisional slot ``t - lead`` holds final slot
    ``t``'s requests), learnt over the last ``span`` final slots: the estimate of the
    ``lead`` slots after the last final one. None: no matched pair yet."""
    fn, fs = final
    pn, ps, pq = early
    size = len(fn)
    t = np.arange(max(size - span, lead), size)
    ok = (fn[t] >= min_requests) & (pn[t - lead] >= min_requests)
    if not ok.any() or fs[t[ok]].sum() <= 0:
        return None
    t = t[ok]
    maturity = float((ps[t - lead].sum() / pn[t - lead].sum()) / (fs[t].sum() / fn[t].sum()))
    if not maturity > 0:
        return None
    error = fs[t] / fn[t] - ps[t - lead] / pn[t - lead] / maturity
    spread = float(np.median(pn[t - lead] * error**2)) / 0.455
    young = np.arange(size - lead, size)
    n = pn[young]
    partial = np.divide(ps[young], n, out=np.zeros(lead), where=n > 0)
    # the per-request variance of partial nDCG, pooled over the span (a slot's own few
    # requests would give a noisy one)
    pooled = np.arange(max(size - span - lead, 0), size)
    mean = ps[pooled].sum() / max(pn[pooled].sum(), 1.0)
    spread_p = max(float(pq[pooled].sum() / max(pn[pooled].sum(), 1.0) - mean * mean), 0.0)
    sampling = np.divide(spread_p, n * maturity**2, out=np.full(lead, np.inf), where=n > 0)
    prediction = np.divide(spread, n, out=np.full(lead, np.inf), where=n > 0)
    return Estimate(partial / maturity, sampling, prediction, n, maturity, partial)
