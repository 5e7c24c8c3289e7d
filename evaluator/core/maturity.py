"""The maturity curve: how much of the final nDCG the interactions of a request's first
minutes give (label maturity, Chapelle 2014). Pure.

At finalisation each request is also scored with only the interactions that came
within each configured *age* after its impression (``regression.maturity_ages``).
Only requests with a relevant interaction later than an age can score less at that
age, so only those are scored again. The sums go into one history array per deadline
day and variant, stored beside the detector's under the variant's name behind
:data:`MATURITY`: row ``a`` holds the requests' count, the engaged ones by age ``a``,
and per K the sum of nDCG@K at that age and of its square; the last row the final
values. The curve at age ``a`` is row ``a``'s sum over the last row's, over the days
the readout spans: a ratio of sums over the same requests, exact across partitions
(the sums are whole numbers of 1e-9, as the history's).

An array is keyed by the start of its day (a reader caching complete arrays must
wait for the day's end, not the hour's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from evaluator.core.provisional import MATURITY
from evaluator.core.regression import DAY_MS, SCALE, HistoryKey
from evaluator.core.scoring import ScoringConfig, score_sparse

FloatArray = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Curves = dict[tuple[str, int], FloatArray]
"""Per (variant, K), the share of the final nDCG that each age gives."""


def partial_ndcg(
    attributed: tuple[I64, I64, FloatArray, I64],
    request_ms: I64,
    final: FloatArray,
    ages_ms: Sequence[int],
    scoring: ScoringConfig,
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Per request, age and K, nDCG@K with the interactions of the request's first
    ``age`` only (shape ``(requests, ages, ks)``), and whether it was engaged by then
    (``(requests, ages)``). ``attributed``: each attributed interaction's request row,
    position, grade and time (:class:`~evaluator.core.finalise.Attributed`); ``final``:
    the requests' nDCG with every interaction."""
    row, position, grade, ms = attributed
    n = len(request_ms)
    out = np.repeat(final[:, None, :], len(ages_ms), axis=1)
    engaged = np.zeros((n, len(ages_ms)), dtype=bool)
    relevant = grade > 0
    delay = ms - request_ms[row]
    for a, age in enumerate(ages_ms):
        within = delay <= age
        engaged[row[relevant & within], a] = True
        changed = np.unique(row[relevant & ~within])
        if not changed.size:
            continue
        keep = within & np.isin(row, changed)
        rows = np.searchsorted(changed, row[keep])
        scores = score_sparse(
            changed.size, rows, position[keep], grade[keep], scoring, metrics=("ndcg",)
        )
        out[changed, a] = scores.values["ndcg"]
    return out, engaged


def maturity_increments(
    deadline_ms: I64,
    variants: tuple[Sequence[str], I64],
    final: tuple[FloatArray, npt.NDArray[np.bool_]],
    partial: tuple[FloatArray, npt.NDArray[np.bool_]],
) -> dict[HistoryKey, FloatArray]:
    """What requests due at ``deadline_ms`` add to the maturity arrays, per (start of
    the deadline's day, variant behind :data:`MATURITY`); ``variants``: (names, each
    request's code); ``final``: nDCG per request and K, and whether it was engaged;
    ``partial``: :func:`partial_ndcg`."""
    names, code = variants
    values, engaged = partial
    final_ndcg, final_engaged = final
    n, ages, ks = values.shape
    if not n:
        return {}
    rows = np.zeros((n, ages + 1, 2 + 2 * ks))
    rows[:, :, 0] = 1.0
    rows[:, :ages, 1] = engaged
    rows[:, ages, 1] = final_engaged
    both = np.concatenate([values, final_ndcg[:, None, :]], axis=1)
    rows[:, :, 2::2] = np.rint(both * SCALE)
    rows[:, :, 3::2] = np.rint(both * both * SCALE)
    day = deadline_ms // DAY_MS
    group = (day - int(day.min())) * len(names) + code
    groups, of_row = np.unique(group, return_inverse=True)
    flat = rows.reshape(n, -1)
    sums = np.stack(
        [np.bincount(of_row.reshape(-1), flat[:, j], len(groups)) for j in range(flat.shape[1])],
        axis=1,
    ).reshape(len(groups), ages + 1, 2 + 2 * ks)
    first = int(day.min())
    out: dict[HistoryKey, FloatArray] = {}
    for i, g in enumerate(groups.tolist()):
        d, v = divmod(g, len(names))
        out[((first + d) * DAY_MS, MATURITY + names[v])] = sums[i]
    return out


def curve(history: Mapping[HistoryKey, FloatArray], since_ms: int, ks: Sequence[int]) -> Curves:
    """Per (variant, K), the share of the final nDCG@K sum that each age's gives, over
    the maturity arrays of the days ending after ``since_ms`` (none: no finalised
    request with a relevant interaction)."""
    summed: dict[str, FloatArray] = {}
    for (hour, name), array in history.items():
        if name.startswith(MATURITY) and hour + DAY_MS > since_ms:
            variant = name[len(MATURITY) :]
            summed[variant] = summed[variant] + array if variant in summed else array
    out: Curves = {}
    for variant, array in sorted(summed.items()):
        for i, k in enumerate(ks):
            final = array[-1, 2 + 2 * i]
            if final > 0:
                out[(variant, k)] = array[:-1, 2 + 2 * i] / final
    return out


def is_maturity(name: str) -> bool:
    return name.startswith(MATURITY)
