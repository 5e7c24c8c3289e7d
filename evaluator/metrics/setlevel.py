"""Set-level metrics over many lists: catalog coverage and intra-list diversity."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from evaluator.sketch import HyperLogLog

FloatArray = npt.NDArray[np.float64]


def distinct_items(lists: Iterable[Sequence[str]], k: int | None = None) -> set[str]:
    """Distinct items in the top ``k`` of each list (whole lists when ``k`` is None)."""
    seen: set[str] = set()
    for items in lists:
        seen.update(items[:k] if k is not None else items)
    return seen


def coverage(recommended: int | float, catalog_size: int | float) -> float:
    """Share of the catalog that was recommended at least once (0 for an empty catalog)."""
    return min(1.0, recommended / catalog_size) if catalog_size > 0 else 0.0


def coverage_exact(
    lists: Iterable[Sequence[str]], catalog_size: int, k: int | None = None
) -> float:
    """Catalog coverage of a set of lists, counted exactly."""
    return coverage(len(distinct_items(lists, k)), catalog_size)


def coverage_sketch(
    lists: Iterable[Sequence[str]], catalog_size: int, k: int | None = None, precision: int = 14
) -> float:
    """Catalog coverage estimated with a HyperLogLog (bounded memory for huge sets)."""
    sketch = HyperLogLog(precision)
    for items in lists:
        sketch.add(items[:k] if k is not None else items)
    return coverage(sketch.count(), catalog_size)


def intra_list_diversity(codes: npt.NDArray[np.int64]) -> FloatArray:
    """Share of item pairs within each list whose attribute differs.

    ``codes`` has shape ``(lists, K)``: an integer code of each shown item's
    attribute value (e.g. its category), ``-1`` for missing or padding. Lists
    with fewer than two coded items get NaN.
    """
    codes = np.asarray(codes)
    valid = codes >= 0
    n_valid = valid.sum(axis=1)
    pairs = n_valid * (n_valid - 1) / 2.0
    same = (codes[:, :, None] == codes[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    same_pairs = (same.sum(axis=(1, 2)) - n_valid) / 2.0
    out = np.full(codes.shape[0], np.nan)
    np.divide(pairs - same_pairs, pairs, out=out, where=pairs > 0)
    return out


def encode_attribute(values: Sequence[Sequence[str]], k: int) -> npt.NDArray[np.int64]:
    """Integer-code the top ``k`` attribute values of each list for :func:`intra_list_diversity`.

    Vectorised: one ``np.unique`` over all values; missing positions get ``-1``.
    """
    tops = [v[:k] for v in values]
    lengths = np.fromiter((len(v) for v in tops), dtype=np.int64, count=len(tops))
    codes = np.full((len(tops), k), -1, dtype=np.int64)
    flat = list(itertools.chain.from_iterable(tops))
    if flat:
        _, inverse = np.unique(np.asarray(flat, dtype=np.str_), return_inverse=True)
        row_idx = np.repeat(np.arange(len(tops)), lengths)
        col_idx = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        codes[row_idx, col_idx] = inverse.ravel()
    return codes
