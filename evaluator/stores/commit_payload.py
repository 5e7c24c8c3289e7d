"""What one finalisation commit writes, computed from the finalised rows (pure).

Blocks: the per-(window, bucket, variant) sums of the requests' statistics rows,
and per (experiment, variant) the cumulative ones.
Coverage: which items go to which HyperLogLog sketch, and which sketches are
merged into longer windows' ones. Propensity: the estimators' counter
increments per day of finalisation. The Redis store turns them into script
arguments.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluator.experiments import SEP
from evaluator.finalise import Finalised
from evaluator.propensity_estimation import Observation, counter_day, increments
from evaluator.windows import AggregateLayout

FloatArray = npt.NDArray[np.float64]
SketchKey = Callable[[int, int, str, int], str]
"""(window ms, bucket start ms, variant, k) -> sketch key; variant "*" and k 0 for the
catalogue sketch of the longest window."""


def block_increments(
    finalised: Finalised, rows: npt.NDArray[np.intp], layout: AggregateLayout
) -> tuple[list[tuple[str, int, int, int]], bytes]:
    """The blocks the given requests add to (name, bucket start, ttl s, window ms), and
    the per-block sums of their rows as little-endian doubles, one block after another."""
    requests = [finalised.requests[i] for i in rows]
    local = finalised.user_bucket[rows] // layout.shards
    cohort = finalised.cohort[rows]
    keys: dict[tuple[int, int, str], int] = {}
    index = np.empty((len(layout.windows_ms), len(requests)), dtype=np.intp)
    for w_i, window in enumerate(layout.windows_ms):
        starts = layout.bucket_start(window, finalised.deadline_ms[rows]).tolist()
        for r_i, (start, request) in enumerate(zip(starts, requests, strict=True)):
            index[w_i, r_i] = keys.setdefault((window, start, request.variant), len(keys))
    sums = np.zeros((len(keys), *layout.block_shape))
    for w_i in range(len(layout.windows_ms)):
        np.add.at(sums, (index[w_i], cohort, local), finalised.rows[rows])
    blocks = [
        (f"{w}:{start}:{variant}", start, (2 * w) // 1000 + 3600, w) for (w, start, variant) in keys
    ]
    return blocks, sums.astype("<f8").tobytes()


def experiment_increments(finalised: Finalised, layout: AggregateLayout) -> dict[str, FloatArray]:
    """Per ``experiment US variant``, the block (cohort, local user bucket, row) that the
    finalised requests add to the experiment's cumulative statistics."""
    out: dict[str, FloatArray] = {}
    if not finalised.experiment_rows:
        return out
    variants = np.asarray([r.variant for r in finalised.requests], dtype=object)
    local = finalised.user_bucket // layout.shards
    for name, rows in finalised.experiment_rows.items():
        for variant in np.unique(variants[rows]).tolist():
            mine = rows[variants[rows] == variant]
            block = out.setdefault(name + SEP + variant, np.zeros(layout.block_shape))
            np.add.at(block, (finalised.cohort[mine], local[mine]), finalised.rows[mine])
    return out


def merge_increments(parts: list[dict[str, FloatArray]]) -> dict[str, FloatArray]:
    """Blocks of several finalised batches summed per key."""
    out: dict[str, FloatArray] = {}
    for part in parts:
        for key, block in part.items():
            if key in out:
                out[key] = out[key] + block
            else:
                out[key] = block
    return out


def coverage_updates(
    finalised: Finalised, layout: AggregateLayout, key: SketchKey
) -> tuple[dict[str, set[str]], list[str]]:
    """Items to add per sketch, and flat (destination, source) pairs to merge after.

    Only windows without a :meth:`AggregateLayout.sketch_source` get items, per
    variant and bucket; the others merge the touched sketches of their source
    window. Cut-offs nest: the top-K sketch gets the ranks after the next smaller
    K, then merges that K's sketch (the top 20 hold the top 10), so each shown
    item is added once, not once per K. The longest window also keeps a catalogue
    sketch of every shown item, merged from its top max(K) sketches plus the items
    beyond max(K), so short lists cost no extra item adds. Merges are listed in
    the order they must run."""
    lists = [r.items for r in finalised.requests]
    variants = [r.variant for r in finalised.requests]
    ks = sorted(layout.ks)
    # ranks (smaller K, K] of each list, sliced once
    slices = {k: [items[lo:k] for items in lists] for lo, k in zip([0, *ks], ks, strict=False)}
    gathered: dict[str, set[str]] = {}
    merges: list[str] = []
    for window in layout.windows_ms:
        if layout.sketch_source(window) is not None:
            continue
        fed = [w for w in layout.windows_ms if layout.sketch_source(w) == window]
        starts = layout.bucket_start(window, finalised.deadline_ms).tolist()
        for (start, variant), rows in _rows_by(starts, variants).items():
            smaller = ""
            for k, ranks in slices.items():
                source = key(window, start, variant, k)
                added = set(chain.from_iterable(map(ranks.__getitem__, rows)))
                if added:
                    gathered[source] = added
                if smaller:
                    merges += [source, smaller]
                smaller = source
                for longer in fed:
                    merges += [
                        key(longer, _longer_start(layout, longer, start), variant, k),
                        source,
                    ]
    # the catalogue sketch: every item shown is in some variant's top max(K) sketch
    # (merged in, after that sketch got this batch's items) or beyond it (added)
    longest, widest = max(layout.windows_ms), max(layout.ks)
    starts = layout.bucket_start(longest, finalised.deadline_ms).tolist()
    for (start, variant), rows in _rows_by(starts, variants).items():
        catalogue = key(longest, start, "*", 0)
        merges += [catalogue, key(longest, start, variant, widest)]
        tails = [lists[r][widest:] for r in rows if len(lists[r]) > widest]
        if tails:
            gathered.setdefault(catalogue, set()).update(chain.from_iterable(tails))
    return gathered, merges


def propensity_increments(finalised: Finalised, rows: npt.NDArray[np.intp]) -> list[Any]:
    """[day, [field, increment, ...], ...]: the given requests' estimator counters per
    day of finalisation (days as strings: Lua would print large numbers as floats)."""
    if not finalised.observations:
        return []
    by_day: dict[int, list[Observation]] = defaultdict(list)
    for i in rows.tolist():
        by_day[counter_day(int(finalised.deadline_ms[i]))].append(finalised.observations[i])
    out: list[Any] = []
    for day, observed in by_day.items():
        counts = increments(observed, finalised.propensity_positions)
        out += [str(day), [x for pair in counts.items() for x in pair]]
    return out


def _rows_by(starts: list[int], variants: list[str] | None) -> dict[tuple[int, str], list[int]]:
    """Rows grouped by (bucket start, variant); variant "" when ``variants`` is None."""
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for row, start in enumerate(starts):
        groups[(start, variants[row] if variants is not None else "")].append(row)
    return groups


def _longer_start(layout: AggregateLayout, window_ms: int, start_ms: int) -> int:
    """Start of the ``window_ms`` bucket holding the bucket that starts at ``start_ms``."""
    return int(layout.bucket_start(window_ms, np.array([start_ms], dtype=np.int64))[0])
