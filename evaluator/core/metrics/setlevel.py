"""Set-level metrics over many lists: catalog coverage and intra-list diversity."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
import numpy.typing as npt

from evaluator.core.sketch import HyperLogLog

FloatArray = npt.NDArray[np.float64]


def distinct_items(lists: Iterable[Sequence[str]], k: int | None = None) -> set[str]:
    """Distinct items in the top ``k`` of each list (whole lists when ``k`` is None)."""
    if k is None:
        return set(itertools.chain.from_iterable(lists))
    return set(itertools.chain.from_iterable(items[:k] for items in lists))


def distinct_by_cutoff(
    lists: Sequence[Sequence[str]], ks: Iterable[int]
) -> tuple[dict[int, int], set[str]]:
    """Distinct items in the top ``k`` for each cutoff, and in the whole lists.

    Each item position is hashed once: the set grows from the top ``k₁`` by the
    slice up to ``k₂``, and so on, and finally by the tails beyond the largest ``k``."""
    seen: set[str] = set()
    counts: dict[int, int] = {}
    done = 0
    longest = max(map(len, lists), default=0)
    for k in sorted(set(ks)):
        if done < longest:
            seen.update(itertools.chain.from_iterable(items[done:k] for items in lists))
            done = k
        counts[k] = len(seen)
    if done < longest:
        seen.update(itertools.chain.from_iterable(items[done:] for items in lists))
    return counts, seen


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
    codes = np.sort(np.asarray(codes), axis=1)  # equal values side by side, -1 first
    valid = codes >= 0
    n_valid = valid.sum(axis=1)
    pairs = n_valid * (n_valid - 1) / 2.0
    # pairs with the same value: each item pairs with the earlier items of its run
    # (linear in K, where comparing every pair would be quadratic)
    position = np.broadcast_to(np.arange(codes.shape[1]), codes.shape)
    starts = np.ones(codes.shape, dtype=bool)
    starts[:, 1:] = codes[:, 1:] != codes[:, :-1]
    run_start = np.maximum.accumulate(np.where(starts, position, 0), axis=1)
    same_pairs = np.where(valid, position - run_start, 0).sum(axis=1).astype(np.float64)
    out = np.full(codes.shape[0], np.nan)
    np.divide(pairs - same_pairs, pairs, out=out, where=pairs > 0)
    return out


def encode_top(values: Sequence[Sequence[Hashable]], k: int) -> npt.NDArray[np.int64]:
    """Integer codes of the first ``k`` values of each list, shape ``(lists, min(k, longest
    list))``, ``-1`` padded.

    Equal strings get equal codes within one call. Used for item ids (coverage)
    and for attribute values (diversity).
    """
    tops = [v[:k] for v in values]
    lengths = np.fromiter(map(len, tops), dtype=np.int64, count=len(tops))
    # no column beyond the longest list: memory is linear in min(k, longest), not k
    codes = np.full((len(tops), int(lengths.max(initial=0))), -1, dtype=np.int64)
    vocabulary: dict[Hashable, int] = {}
    intern = vocabulary.setdefault
    flat = np.fromiter(
        (intern(v, len(vocabulary)) for v in itertools.chain.from_iterable(tops)),
        dtype=np.int64,
        count=int(lengths.sum()),
    )
    if flat.size:
        row_idx = np.repeat(np.arange(len(tops)), lengths)
        col_idx = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        codes[row_idx, col_idx] = flat
    return codes


def distinct_codes(codes: npt.NDArray[np.int64]) -> int:
    """Number of distinct non-negative codes in a matrix from :func:`encode_top`."""
    return int(np.unique(codes[codes >= 0]).size)
