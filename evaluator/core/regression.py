"""Regression detection on nDCG: a seasonal baseline and a one-sided CUSUM. Pure.

Why not a fixed threshold: at 50 requests an hour a 10% dip is noise, at 50,000 a 2%
dip is an incident, and nDCG moves with the hour of day and the day of week. So each
variant's nDCG@K is compared, slot by slot (``slot_ms``, default 5 minutes of
finalisation time), with the same time of week over the last ``baseline_weeks``
weeks (each a neighbourhood of ``±neighbourhood_slots`` slots, so quiet hours still
have a baseline), and each slot's standardised residual feeds a one-sided CUSUM
(Page 1954) tuned to a shift of ``shift`` standard deviations:

    z_t = (x_t − b_t) / sqrt(s²_x/n_t + s²_b/n_b + τ²),   S_t = max(0, S_{t−1} − z_t − shift/2)

``x_t``: the slot's mean nDCG over its ``n_t`` requests; ``b_t``: the baseline's
(a ratio of sums); ``s²``: per-request variances from stored sums of squares;
``τ²``: the residuals' excess variance (users' clustering, slot-to-slot noise of
the baseline), estimated robustly from the span's successive residual differences,
which a level shift such as the regression itself barely moves. A variant is *in regression* from
when ``S_t`` crosses ``h`` until it is back to 0 (no flapping near the threshold);
``h`` solves Siegmund's approximation of the in-control run length for the
false-alarm budget (``false_alarms_per_30d`` per variant, split over its cutoffs),
and ``S`` is capped at ``1.5 h`` so a recovered variant clears within ``3 h / shift``
slots (about 35 minutes at the defaults). The change point reported is where the
current excursion began.

State: per hour of finalisation and variant, an array of shape ``(slots per hour,
2 + 2·len(ks))``: requests, engaged requests, then per K the sum and the sum of
squares of nDCG@K in units of 1e-9 (:data:`SCALE`), rounded per request. Integers
held in doubles add exactly in any order (below 2^53), so partitions, replay and any
number of instances give the same sums, and the detector, recomputed from them at
each readout over the last ``span_ms``, gives the same answer everywhere.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from evaluator.core.provisional import Estimate, estimate, split_history
from evaluator.core.rows import COUNT, ENGAGED, RowSchema

FloatArray = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
WEEK_MS = 7 * DAY_MS
MONTH_MS = 30 * DAY_MS
SCALE = 1e9
"""nDCG sums are kept in units of 1e-9 (whole numbers: exact in any order)."""
HistoryKey = tuple[int, str]
"""(hour start ms, variant) of a history array."""


@dataclass(frozen=True, slots=True)
class RegressionRules:
    """The detector's settings, as plain values (``[regression]`` in the configuration)."""

    ks: tuple[int, ...]
    slot_ms: int = 300_000
    baseline_weeks: int = 3
    neighbourhood_slots: int = 6
    false_alarms_per_30d: float = 0.25
    shift: float = 2.0
    min_requests: int = 20
    span_ms: int = DAY_MS
    lead_slots: int = 0
    """How many slots provisional data run ahead of final (0: none kept)."""
    age_ms: int = 0
    """The age, after the impression, of the interactions provisional data hold."""
    ready_ms: int = 0
    """A provisional slot is complete this long after its end (its requests are
    scored after the time they are slotted at)."""
    maturity_ages_ms: tuple[int, ...] = ()
    """The maturity curve's ages (:mod:`evaluator.core.maturity`; none: not kept)."""

    def __post_init__(self) -> None:
        if HOUR_MS % self.slot_ms:
            raise ValueError("regression.slot must divide an hour")

    @property
    def slots_per_hour(self) -> int:
        return HOUR_MS // self.slot_ms

    @property
    def width(self) -> int:
        """Doubles per slot: requests, engaged requests, then each K's sum and sum of
        squares."""
        return 2 + 2 * len(self.ks)

    @property
    def history_ms(self) -> int:
        """How far back the detector reads (and the stores keep)."""
        around = (self.neighbourhood_slots + 1) * self.slot_ms
        return self.baseline_weeks * WEEK_MS + self.span_ms + around + HOUR_MS

    @property
    def threshold(self) -> float:
        """``h`` of each (variant, K) CUSUM: its in-control run length is the slots of
        30 days times the cutoffs over the budget, doubled when provisional slots are
        read too (each is looked at again as its estimate changes, then final)."""
        arl = MONTH_MS / self.slot_ms * len(self.ks) / self.false_alarms_per_30d
        return cusum_threshold(arl * (1 + self.lead_slots), self.shift / 2)


@functools.lru_cache(maxsize=64)
def cusum_threshold(arl: float, drift: float) -> float:
    """The threshold giving a one-sided CUSUM of N(0, 1) increments with reference
    ``drift`` an in-control average run length ``arl`` (Siegmund 1985:
    ``ARL ≈ (e^{2kb} − 2kb − 1) / 2k²``, ``b = h + 1.166``), by bisection (cached: a
    readout asks it once per variant and cutoff)."""

    def run_length(h: float) -> float:
        a = 2 * drift * (h + 1.166)
        return (math.exp(a) - a - 1) / (2 * drift * drift)

    lo, hi = 0.0, 1.0
    while run_length(hi) < arl:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if run_length(mid) < arl else (lo, mid)
    return hi


def row_columns(schema: RowSchema, ks: Sequence[int]) -> list[int]:
    """The statistics-row columns a history array sums, in its order (count, engaged,
    then per K nDCG@K's sum and square)."""
    columns = [schema.index(COUNT), schema.index(ENGAGED)]
    for k in ks:
        columns += [schema.value("ndcg", k), schema.index(f"sq:ndcg@{k}")]
    return columns


def history_increments(
    rules: RegressionRules, deadline_ms: I64, variant: Sequence[str], per_request: FloatArray
) -> dict[HistoryKey, FloatArray]:
    """What requests finalised at ``deadline_ms`` add to the history: per (hour,
    variant) an array of (slots per hour, :attr:`RegressionRules.width`).
    ``per_request``: each request's count (1), engaged (0 or 1), then per K of
    ``rules.ks`` its nDCG@K and the square of it, as the statistics rows hold them."""
    if not len(variant):
        return {}
    return coded_increments(rules, deadline_ms, variant_codes(variant), per_request)


def variant_codes(variant: Sequence[str]) -> tuple[list[str], I64]:
    """The distinct names, and each request's index among them."""
    index = {name: i for i, name in enumerate(dict.fromkeys(variant))}
    code = np.fromiter(map(index.__getitem__, variant), dtype=np.int64, count=len(variant))
    return list(index), code


def coded_increments(
    rules: RegressionRules,
    deadline_ms: I64,
    variants: tuple[Sequence[str], I64],
    per_request: FloatArray,
) -> dict[HistoryKey, FloatArray]:
    """:func:`history_increments` of requests whose variants are given as (names,
    each request's code)."""
    names, code = variants
    if not len(code):
        return {}
    scaled = np.array(per_request, dtype=np.float64)
    scaled[:, 2:] = np.rint(scaled[:, 2:] * SCALE)
    hour = deadline_ms // HOUR_MS
    first = int(hour.min())
    group = (hour - first) * len(names) + code
    groups, of_row = np.unique(group, return_inverse=True)
    per_hour = rules.slots_per_hour
    cell = of_row.reshape(-1) * per_hour + (deadline_ms % HOUR_MS) // rules.slot_ms
    size = len(groups) * per_hour
    sums = np.stack(
        [np.bincount(cell, scaled[:, j], size) for j in range(rules.width)], axis=1
    ).reshape(len(groups), per_hour, rules.width)
    out: dict[HistoryKey, FloatArray] = {}
    for i, g in enumerate(groups.tolist()):
        h, v = divmod(g, len(names))
        out[((first + h) * HOUR_MS, names[v])] = sums[i]
    return out


@dataclass(frozen=True, slots=True)
class Detection:
    """One (variant, K) series at the readout: ``score`` is ``S / h`` (≥ 1: in
    regression); ``since_ms``: where the current excursion began (None: S is 0);
    ``current``/``baseline``: the last armed slot's nDCG (provisional when the
    provisional data reach further than the final) and its baseline; ``provisional``:
    the latest provisional slot's estimate of its final nDCG, with its 95% band's
    half-width, the maturity it divided by and the partial nDCG it saw (None: none)."""

    score: float
    regression: bool
    since_ms: int | None
    current: float | None
    baseline: float | None
    armed: bool
    provisional: float | None = None
    band: float | None = None
    maturity: float | None = None
    partial: float | None = None


def slot_series(
    rules: RegressionRules, history: Mapping[HistoryKey, FloatArray], variant: str, end_ms: int
) -> tuple[int, FloatArray]:
    """The variant's slots from ``end_ms − history_ms`` to ``end_ms`` (a slot
    boundary), densely: (first slot's start, array (slots, width))."""
    start = end_ms - rules.history_ms
    start -= start % HOUR_MS
    slots = (end_ms - start) // rules.slot_ms
    dense = np.zeros((slots + rules.slots_per_hour, rules.width))
    per_hour = rules.slots_per_hour
    for (hour, name), block in history.items():
        if name == variant and start <= hour < end_ms:
            at = (hour - start) // rules.slot_ms
            dense[at : at + per_hour] += block
    return start, dense[:slots]


def detect(
    rules: RegressionRules,
    history: Mapping[HistoryKey, FloatArray],
    now_ms: int,
    zero_relevance: str = "count",
) -> dict[tuple[str, int], Detection]:
    """Every variant's detection per K at data time ``now_ms`` (slots ending by then
    are complete: their requests are final, or provisional); ``zero_relevance``:
    ``"skip"`` averages over engaged requests only, as the window means do."""
    end = now_ms - now_ms % rules.slot_ms
    out: dict[tuple[str, int], Detection] = {}
    final, early = split_history(history)
    by_variant: dict[str, dict[HistoryKey, FloatArray]] = {}
    for key, array in final.items():
        by_variant.setdefault(key[1], {})[key] = array
    for variant, mine in sorted(by_variant.items()):
        start, dense = slot_series(rules, mine, variant, end)
        young = None
        if rules.lead_slots and any(name == variant for _, name in early):
            young = slot_series(rules, early, variant, end)[1]
            ready = (now_ms - rules.ready_ms) // rules.slot_ms * rules.slot_ms
            young[len(young) - (end - ready) // rules.slot_ms :] = 0.0  # still being scored
        found = detect_slots(rules, dense, start, zero_relevance, young)
        for k, one in zip(rules.ks, found, strict=True):
            out[(variant, k)] = one
    return out


def detect_slots(
    rules: RegressionRules,
    dense: FloatArray,
    start_ms: int,
    zero_relevance: str = "count",
    young: FloatArray | None = None,
) -> list[Detection]:
    """Per K, the detection over one variant's dense slots (:func:`slot_series`) that
    begin at ``start_ms``; the last slot is the latest complete one. ``young``: the
    provisional slots on the same axis, if any."""
    counted = 1 if zero_relevance == "skip" else 0
    return [
        _detect_one(rules, dense, start_ms, i, counted=counted, young=young)
        for i in range(len(rules.ks))
    ]


Series = tuple[FloatArray, FloatArray, FloatArray]
"""Per slot: requests, the sum of nDCG, the sum of its squares."""


def _columns(dense: FloatArray, i: int, counted: int) -> Series:
    return dense[:, counted], dense[:, 2 + 2 * i] / SCALE, dense[:, 3 + 2 * i] / SCALE


def _mean(series: Series, t: I64) -> tuple[FloatArray, FloatArray]:
    """Slots ``t``'s mean and the variance of that mean."""
    n, s, q = (c[t] for c in series)
    x = np.divide(s, n, out=np.zeros(len(t)), where=n > 0)
    v = np.maximum(np.divide(q, n, out=np.zeros(len(t)), where=n > 0) - x * x, 0.0)
    return x, np.divide(v, n, out=np.zeros(len(t)), where=n > 0)


def _baseline(rules: RegressionRules, series: Series, t: I64) -> tuple[FloatArray, Series]:
    """Slots ``t``'s baseline requests, and its (requests, sum, squares) as a series.
    The three columns go through one cumulative sum (row by row, as each alone)."""
    week, m = WEEK_MS // rules.slot_ms, rules.neighbourhood_slots
    size = len(series[0])
    sums = np.zeros((size + 1, 3))
    np.cumsum(np.stack(series, axis=1), axis=0, out=sums[1:])
    out = np.zeros((len(t), 3))
    for w in range(1, rules.baseline_weeks + 1):
        at = t - w * week
        hi = np.minimum(np.maximum(at + (m + 1), 0), size)  # np.clip, without its wrapper
        out += sums[hi] - sums[np.minimum(np.maximum(at - m, 0), size)]
    return out[:, 0], (out[:, 0], out[:, 1], out[:, 2])


def _residuals(
    rules: RegressionRules, dense: FloatArray, i: int, counted: int, young: FloatArray | None
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_], FloatArray, FloatArray, Estimate | None]:
    """Over the span's slots, then the provisional ones: residual, its variance
    (sampling or prediction), armed, value, baseline; and the provisional estimate."""
    span = rules.span_ms // rules.slot_ms
    series = _columns(dense, i, counted)
    t = np.arange(len(dense) - span, len(dense))
    x, _ = _mean(series, t)
    nt = series[0][t]
    found = None
    if young is not None:
        early = _columns(young, i, counted)
        found = estimate(series[:2], early, span, rules.lead_slots, rules.min_requests)
    if found is not None:
        t = np.arange(len(dense) - span, len(dense) + rules.lead_slots)
        x, nt = np.concatenate([x, found.mean]), np.concatenate([nt, found.n])
    bn, base = _baseline(rules, series, t)
    b, vb = _mean(base, np.arange(len(t)))
    # a slot's mean varies as one request does over its count: the per-request variance
    # is the baseline's, pooled over weeks of the same time (a slot's own few requests
    # would give it a noisy variance, and heavy tails to its z)
    vx = np.divide(vb * bn, nt, out=np.full(len(t), np.inf), where=nt > 0)
    if found is not None:  # estimates from partial data: their own variance, pooled too
        vx[-rules.lead_slots :] = found.variance
    armed = (nt >= rules.min_requests) & (bn >= rules.min_requests)
    return x - b, vx + vb, armed, x, b, found


def _excess_variance(r: FloatArray, sampling: FloatArray) -> float:
    """The residuals' variance beyond sampling, from successive differences (a level
    shift, such as the regression itself, moves one difference only): the median of
    a N(0, 2V) difference squared is 0.455 x 2V."""
    if r.size < 3:
        return 0.0
    total = float(np.median(np.diff(r) ** 2)) / (2 * 0.455)
    return max(0.0, total - float(np.median(sampling)))


def _detect_one(
    rules: RegressionRules,
    dense: FloatArray,
    start: int,
    i: int,
    *,
    counted: int,
    young: FloatArray | None,
) -> Detection:
    r, sampling, armed, x, b, found = _residuals(rules, dense, i, counted, young)
    early = _provisional(found)
    if not armed.any():
        return Detection(0.0, False, None, None, None, False, *early)
    final = armed[: len(armed) - (rules.lead_slots if found else 0)]
    tau2 = _excess_variance(r[: len(final)][final], sampling[: len(final)][final])
    scale = np.sqrt(sampling + tau2)
    z = np.divide(r, scale, out=np.zeros_like(r), where=armed & np.isfinite(scale) & (scale > 0))
    h, drift = rules.threshold, rules.shift / 2
    cusum, began, flagged, cap = 0.0, -1, False, 1.5 * h
    first = (len(dense) - rules.span_ms // rules.slot_ms) * rules.slot_ms + start
    slots = np.flatnonzero(armed)
    for j, zj in zip(slots.tolist(), z[slots].tolist(), strict=True):  # Python floats
        if cusum == 0.0:
            began = j
        cusum = cusum - zj - drift
        if not cusum > 0.0:  # max(0.0, ...): -0.0 and NaN become 0.0 as there
            cusum = 0.0
        elif cusum > cap:
            cusum = cap
        if cusum >= h:
            flagged = True
        elif cusum == 0.0:  # flagged until the excursion ends (no flapping near h)
            flagged = False
    last = int(slots[-1])
    since = first + began * rules.slot_ms if cusum > 0 else None
    return Detection(cusum / h, flagged, since, float(x[last]), float(b[last]), True, *early)


def _provisional(
    found: Estimate | None,
) -> tuple[float | None, float | None, float | None, float | None]:
    """The latest provisional slot's estimate, band, maturity and partial mean."""
    if found is None or not found.n[-1] > 0:
        return None, None, None, None
    band = float(found.band()[-1])
    return float(found.mean[-1]), band, found.maturity, float(found.partial[-1])


__all__ = [
    "SCALE",
    "Detection",
    "RegressionRules",
    "coded_increments",
    "cusum_threshold",
    "detect",
    "detect_slots",
    "history_increments",
    "row_columns",
    "slot_series",
    "variant_codes",
]
