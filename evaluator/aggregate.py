"""Sufficient statistics of per-request scores, grouped, and the means read from them.

Groups keep a request count, an engaged-request count, and per-column sums and
sums of squares. Sums merge by addition, so window buckets, user buckets and
instances combine exactly. Requests without a relevant item score 0 on every
metric, so the zero-relevance policy only chooses the denominator when reading
a mean: all requests (``count``) or engaged ones only (``skip``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from evaluator.scoring import RequestScores

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


@dataclass(slots=True)
class Moments:
    """Counts and sums for ``groups`` rows and the metric columns of :class:`RequestScores`."""

    count: npt.NDArray[np.int64]
    engaged: npt.NDArray[np.int64]
    sums: FloatArray
    sumsq: FloatArray

    @classmethod
    def zeros(cls, groups: int, columns: int) -> Moments:
        return cls(
            np.zeros(groups, dtype=np.int64),
            np.zeros(groups, dtype=np.int64),
            np.zeros((groups, columns)),
            np.zeros((groups, columns)),
        )

    def add(self, other: Moments) -> None:
        """Merge another set of moments with the same shape (e.g. from another batch)."""
        self.count += other.count
        self.engaged += other.engaged
        self.sums += other.sums
        self.sumsq += other.sumsq

    def means(self, policy: ZeroRelevancePolicy = "count") -> FloatArray:
        """Mean of each column per group; NaN for a group with no qualifying request."""
        qualifying = (self.count, self.engaged)[denominator_column(policy)]
        denom = qualifying.astype(np.float64)[:, None]
        out = np.full(self.sums.shape, np.nan)
        np.divide(self.sums, denom, out=out, where=denom > 0)
        return out


def group_moments(group: npt.NDArray[np.int64], groups: int, scores: RequestScores) -> Moments:
    """Moments of each group; ``group[r]`` is the group code (0..groups-1) of request ``r``."""
    values = scores.matrix()
    columns = values.shape[1]
    moments = Moments.zeros(groups, columns)
    moments.count += np.bincount(group, minlength=groups)
    moments.engaged += np.bincount(group, weights=scores.engaged, minlength=groups).astype(np.int64)
    squares = values * values
    for col in range(columns):
        moments.sums[:, col] = np.bincount(group, weights=values[:, col], minlength=groups)
        moments.sumsq[:, col] = np.bincount(group, weights=squares[:, col], minlength=groups)
    return moments
