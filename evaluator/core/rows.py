"""Named columns of the statistics rows, and how a stored row layout grows.

A statistics row holds, per finalised request (and summed per group), a request
count, an engaged-request count, per metric@K a sum and a sum of squares, the
diversity and rank-biased-overlap sums with their own counts, and (added per user,
at exposure) the CUPED covariate's sum and users, and (in a ranker pair's row)
the interleaving outcomes. Columns are
named (``count``, ``sum:ndcg@10``, ``sq:mrr@20``, ``div_lists@10``, ...), so the
stored layout is a list of names, not a position scheme.

Growing: a version that computes columns the stored layout lacks (a new metric,
a new cutoff) appends them after a *generation marker*, a pair of counts
``count#g`` and ``engaged#g`` of the requests written since. Blocks written
before have none of the generation's columns (read as zeros), so a metric of
generation g is the mean over the requests that have it: its sum over the
generation's own count. Fresh state has no markers and reads as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

COUNT, ENGAGED = "count", "engaged"
COVARIATE = ("cuped_x", "cuped_users")
"""The CUPED covariate's sum over exposed users and how many users have one (added
per user at exposure, not per request: :mod:`evaluator.core.ab.cuped`)."""
INTERLEAVING = ("il_sum", "il_requests", "il_wins")
"""A ranker pair's outcome sum over its informative requests, their count, and those
the second ranker won (:mod:`evaluator.core.ab.interleaving`; zeros in a variant's row)."""
_MARKER = re.compile(r"^(count|engaged)#(\d+)$")


def fresh_columns(ks: Sequence[int], metrics: Sequence[str]) -> tuple[str, ...]:
    """Columns of a new layout, in the order every version before named columns used."""
    values = [f"{m}@{k}" for m in metrics for k in ks]
    return (
        COUNT,
        ENGAGED,
        *(f"sum:{v}" for v in values),
        *(f"sq:{v}" for v in values),
        *(f"div_lists@{k}" for k in ks),
        *(f"div_sum@{k}" for k in ks),
        "rbo_lists",
        "rbo_sum",
        *COVARIATE,
        *INTERLEAVING,
    )


@dataclass(frozen=True, slots=True)
class RowSchema:
    """The named columns of a statistics row, in stored order."""

    names: tuple[str, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _generation: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(set(self.names)) != len(self.names):
            raise ValueError("duplicate column names in a row layout")
        generation, current = [], 0
        for name in self.names:
            marker = _MARKER.match(name)
            if marker:
                current = int(marker.group(2))
            generation.append(current)
        object.__setattr__(self, "_index", {n: i for i, n in enumerate(self.names)})
        object.__setattr__(self, "_generation", tuple(generation))

    @property
    def width(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        return self._index[name]

    def has(self, metric: str, k: int) -> bool:
        return f"sum:{metric}@{k}" in self._index

    def value(self, metric: str, k: int) -> int:
        """Column of the sum of ``metric@k``."""
        return self._index[f"sum:{metric}@{k}"]

    def denominator(self, metric: str, k: int, zero_relevance: str) -> int:
        """Column a mean of ``metric@k`` divides by: the requests (``zero_relevance =
        "count"``) or engaged requests (``"skip"``) of the metric's generation."""
        base = ENGAGED if zero_relevance == "skip" else COUNT
        generation = self._generation[self.value(metric, k)]
        return self._index[f"{base}#{generation}" if generation else base]

    def mean(self, rows: FloatArray, metric: str, k: int, zero_relevance: str) -> float:
        """Mean of ``metric@k`` over summed rows (any leading shape); NaN without requests."""
        denom = float(rows[..., self.denominator(metric, k, zero_relevance)].sum())
        return float(rows[..., self.value(metric, k)].sum()) / denom if denom else float("nan")

    def missing(self, wanted: RowSchema) -> list[str]:
        """Columns of this layout that ``wanted`` does not compute (markers aside)."""
        return [n for n in self.names if not _MARKER.match(n) and n not in wanted._index]

    def grown(self, wanted: RowSchema) -> RowSchema:
        """This (stored) layout with ``wanted``'s new columns appended after a new
        generation marker; itself when nothing is new."""
        new = [n for n in wanted.names if not _MARKER.match(n) and n not in self._index]
        if not new:
            return self
        generation = max(self._generation, default=0) + 1
        return RowSchema((*self.names, f"{COUNT}#{generation}", f"{ENGAGED}#{generation}", *new))

    def assemble(self, named: Sequence[str], rows: FloatArray) -> FloatArray:
        """Rows in this layout from ``rows`` whose columns are ``named`` (a fresh
        layout's, as computed): markers take the count and engaged columns."""
        if tuple(named) == self.names:
            return rows
        source = {n: i for i, n in enumerate(named)}
        take = []
        for name in self.names:
            marker = _MARKER.match(name)
            take.append(source[marker.group(1) if marker else name])
        return rows[:, np.asarray(take, dtype=np.intp)]


def widen(block: FloatArray, width: int) -> FloatArray:
    """A stored block (any leading shape) written with fewer columns, padded with
    zeros to ``width``: the columns added since are absent, so their sums are 0."""
    have = block.shape[-1]
    if have == width:
        return block
    if have > width:
        raise ValueError(f"a stored block has {have} columns, this layout {width}")
    pad = [(0, 0)] * (block.ndim - 1) + [(0, width - have)]
    return np.pad(block, pad)


def column_map(
    schema: RowSchema, ks: Sequence[int], metrics: Sequence[str]
) -> Mapping[tuple[str, int], int]:
    """``(metric, k)`` -> sum column, for the metrics and cutoffs the layout has."""
    return {(m, k): schema.value(m, k) for m in metrics for k in ks if schema.has(m, k)}
