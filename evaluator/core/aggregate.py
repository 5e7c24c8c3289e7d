"""Statistics rows summed per group, and the means read from them.

A statistics row (:func:`evaluator.core.windows.contribution_rows`) holds a request
count, an engaged-request count, and per metric column a sum and a sum of
squares. Rows merge by addition, so window buckets, user buckets, instances and
replay's per-variant totals combine exactly and are read by the same
:func:`row_mean`. Requests without a relevant item score 0 on every metric, so
the zero-relevance policy only chooses the denominator when reading a mean: all
requests (``count``) or engaged ones only (``skip``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
ZeroRelevancePolicy = Literal["count", "skip"]


def denominator_column(zero_relevance: str) -> int:
    """What a mean divides by, as a statistics-row column: 0, every request
    (``zero_relevance = "count"``), or 1, engaged requests only (``"skip"``). The one
    definition behind replay's means, the exported gauges and the A/B differences."""
    return 1 if zero_relevance == "skip" else 0


def row_mean(rows: FloatArray, column: int, zero_relevance: str) -> float:
    """The mean of one metric column over statistics rows (any leading shape): its sum
    over the qualifying requests' count; NaN when there are none."""
    denom = float(rows[..., denominator_column(zero_relevance)].sum())
    return float(rows[..., column].sum()) / denom if denom else float("nan")


def group_rows(group: npt.NDArray[np.int64], groups: int, rows: FloatArray) -> FloatArray:
    """Statistics rows summed per group (``group[r]`` in 0..groups-1 is row r's group):
    what a window bucket holds for its requests, read with :func:`row_mean`."""
    out = np.zeros((groups, rows.shape[1]))
    for col in range(rows.shape[1]):
        out[:, col] = np.bincount(group, weights=rows[:, col], minlength=groups)
    return out
