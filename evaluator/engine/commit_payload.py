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
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.interleaving import add_outcomes
from evaluator.core.aggregate import group_rows
from evaluator.core.experiments import SEP
from evaluator.core.finalise import Finalised
from evaluator.core.maturity import is_maturity, maturity_increments
from evaluator.core.propensity.estimation import Observation, counter_day, increments
from evaluator.core.regression import HistoryKey, RegressionRules, row_columns, variant_codes
from evaluator.core.regression import history_increments as slot_sums
from evaluator.core.rows import COVARIATE, INTERLEAVING
from evaluator.core.sketch import U64, hash_strings
from evaluator.core.windows import AggregateLayout, block_ttl_s, partition_user_buckets

FloatArray = npt.NDArray[np.float64]
K = TypeVar("K", bound=Hashable)
I64 = npt.NDArray[np.int64]
_NOTHING = np.zeros(0, dtype=np.intp)
"""No positions: a sketch that only holds the union of others (never modified)."""
SketchKey = Callable[[int, int, str, int], str]
"""(window ms, bucket start ms, variant, k) -> sketch key; variant "*" and k 0 for the
catalogue sketch of the longest window, a variant and k :data:`USERS` for its users."""
USERS = 0
"""The "cutoff" of a variant's sketch of the users with a finalised request (whose
hashes share the item sketches' batch and writes)."""


def block_increments(
    finalised: Finalised, rows: npt.NDArray[np.intp], layout: AggregateLayout
) -> tuple[list[tuple[str, int, int, int]], bytes]:
    """The blocks the given requests add to (name, bucket start, ttl s, window ms), and
    the per-block sums of their rows as little-endian doubles, one block after another."""
    names, variant = _codes([finalised.due.variant[i] for i in rows.tolist()])
    local = finalised.user_bucket[rows] // layout.shards
    cohort = finalised.cohort[rows]
    values = finalised.rows[rows]
    deadlines = finalised.deadline_ms[rows]
    blocks: list[tuple[str, int, int, int]] = []
    sums: list[FloatArray] = []
    for window in layout.windows_ms:
        groups, of_row = _groups(layout, window, deadlines, variant, len(names))
        sums.append(_summed(layout, (of_row, cohort, local), values, len(groups)))
        ttl = block_ttl_s(window)
        blocks += [(f"{window}:{start}:{names[v]}", start, ttl, window) for start, v in groups]
    data = np.concatenate(sums) if sums else np.zeros((0, *layout.block_shape))
    return blocks, data.astype("<f8").tobytes()


def experiment_increments(finalised: Finalised, layout: AggregateLayout) -> dict[str, FloatArray]:
    """Per ``experiment US variant``, the block (cohort, local user bucket, row) that the
    finalised requests add to the experiment's cumulative statistics; and per
    ``experiment US pair`` the interleaving outcomes of each ranker pair."""
    out: dict[str, FloatArray] = {}
    if not finalised.experiment_rows:
        return out
    variants = np.asarray(finalised.due.variant, dtype=object)
    local = finalised.user_bucket // layout.shards
    credited = finalised.interleaving
    total, requests, wins = (layout.schema.index(c) for c in INTERLEAVING)
    for name, rows in finalised.experiment_rows.items():
        for variant in np.unique(variants[rows]).tolist():
            mine = rows[variants[rows] == variant]
            cells = (np.zeros(mine.size, np.int64), finalised.cohort[mine], local[mine])
            block = _summed(layout, cells, finalised.rows[mine], 1)[0]
            held = out.get(name + SEP + variant)
            out[name + SEP + variant] = block if held is None else held + block
        if credited is not None:

            def block_of(pair: str, name: str = name) -> FloatArray:
                return out.setdefault(name + SEP + pair, np.zeros(layout.block_shape))

            at = (finalised.cohort, local)
            add_outcomes(block_of, credited, rows, at, (total, requests, wins))
    return out


def covariate_increments(
    covariates: dict[str, list[tuple[str, int]]], layout: AggregateLayout
) -> dict[str, FloatArray]:
    """Per ``experiment US variant``, the block that newly exposed users' CUPED
    covariates add (cohort 0, their local user bucket, the covariate's sum and users):
    per user, where :func:`experiment_increments` adds per request."""
    out: dict[str, FloatArray] = {}
    x, users = (layout.schema.index(name) for name in COVARIATE)
    for key, pairs in covariates.items():
        local = partition_user_buckets([u for u, _ in pairs], layout, 0) // layout.shards
        block = out[key] = np.zeros(layout.block_shape)
        np.add.at(block[0, :, x], local, np.asarray([v for _, v in pairs], dtype=np.float64))
        np.add.at(block[0, :, users], local, 1.0)
    return out


def merge_increments(parts: list[dict[K, FloatArray]]) -> dict[K, FloatArray]:
    """Blocks of several finalised batches summed per key."""
    out: dict[K, FloatArray] = {}
    for part in parts:
        for key, block in part.items():
            if key in out:
                out[key] = out[key] + block
            else:
                out[key] = block
    return out


@dataclass(slots=True)
class CoverageUpdate:
    """What one batch of finalised requests adds to the coverage sketches: every shown
    item's stable hash once (``hashes``, flattened in request order) and, per sketch
    the batch touches, the positions in ``hashes`` added to it directly and the
    sketches (earlier in ``sketches``) whose items of this batch it holds too."""

    hashes: U64
    sketches: dict[str, tuple[npt.NDArray[np.intp], list[str]]]


def coverage_updates(
    finalised: Finalised, layout: AggregateLayout, key: SketchKey
) -> CoverageUpdate:
    """Which shown items go to which sketch (as positions, and unions of other sketches).

    Windows without a :meth:`AggregateLayout.sketch_source` get items, per variant
    and bucket; the others hold the union of their source window's sketches inside
    their bucket. Cut-offs nest: the top-K sketch gets the ranks after the next
    smaller K and holds that K's sketch (the top 20 hold the top 10), so each shown
    item is placed once, not once per K. The longest window also keeps a catalogue
    sketch of every shown item: the union of its top max(K) sketches plus the items
    beyond max(K). The writer builds each sketch's part of the batch in the process
    and merges it into the stored sketch once: no merges between stored sketches,
    each of which costs Redis a pass over all 16,384 registers. Computed over arrays
    (no per-item Python work), over each shown item's stable hash."""
    items = finalised.due.items
    lengths = items.lengths()
    item_hashes = finalised.item_hashes(items.flat)
    # each request's user after the shown items: position len(items) + request
    hashes = np.concatenate([item_hashes, hash_strings(finalised.due.user_id)])
    row = items.row_of()
    rank = np.arange(item_hashes.size) - np.repeat(items.off[:-1].astype(np.int64), lengths)
    ks = sorted(layout.ks)
    # cut-off level of each shown item: ranks (ks[j-1], ks[j]] go to the top-ks[j] sketch
    level = np.searchsorted(np.asarray(ks), rank, side="right")
    variants, variant = _codes(finalised.due.variant)
    out = CoverageUpdate(hashes, {})
    longest, widest = max(layout.windows_ms), max(ks)
    tops: dict[int, list[str]] = {}  # longest-window bucket -> its top max(K) sketches
    placed: list[tuple[int, int, str, int, str]] = []  # (window, start, variant, k, name)
    for window in layout.windows_ms:
        if layout.sketch_source(window) is not None:
            continue
        groups, of_row = _groups(layout, window, finalised.deadline_ms, variant, len(variants))
        # positions of each (group, level), grouped by one stable sort
        levels = len(ks) + 1  # the last: ranks beyond max(K), in no cut-off's sketch
        cell = of_row[row] * levels + level
        order = np.argsort(cell, kind="stable")
        counts = np.bincount(cell, minlength=len(groups) * levels)
        bounds = np.cumsum(counts) - counts
        users = _by_group(of_row, len(groups), item_hashes.size)
        for g, (start, v) in enumerate(groups):
            smaller: list[str] = []
            for j, k in enumerate(ks):
                name = key(window, start, variants[v], k)
                c = g * levels + j
                out.sketches[name] = (order[bounds[c] : bounds[c] + counts[c]], smaller)
                placed.append((window, start, variants[v], k, name))
                smaller = [name]
            if window == longest:
                tops.setdefault(start, []).append(smaller[0])
            name = key(window, start, variants[v], USERS)
            out.sketches[name] = (users[g], [])
            placed.append((window, start, variants[v], USERS, name))
    for window in layout.windows_ms:
        source = layout.sketch_source(window)
        for w, start, shown_by, k, name in placed if source is not None else ():
            if w != source:
                continue
            long_start = _longer_start(layout, window, start)
            longer = key(window, long_start, shown_by, k)
            if longer not in out.sketches:
                out.sketches[longer] = (_NOTHING, [])
                if window == longest and k == widest:
                    tops.setdefault(long_start, []).append(longer)
            out.sketches[longer][1].append(name)
    _catalogue(out, layout, key, tops, deadlines=finalised.deadline_ms, row=row, level=level)
    return out


def _summed(
    layout: AggregateLayout, at: tuple[I64, I64, I64], values: FloatArray, blocks: int
) -> FloatArray:
    """``blocks`` blocks holding the sums of statistics rows ``values`` at (block,
    cohort, local user bucket) ``at``: ``np.add.at``'s sums in the same order, without
    its per-element cost (a few times slower at a checkpoint's thousands of rows)."""
    cohorts, local, width = layout.block_shape
    block, cohort, bucket = at
    cell = (block * cohorts + cohort) * local + bucket
    summed = group_rows(cell, blocks * cohorts * local, values.reshape(-1, width))
    return summed.reshape(blocks, cohorts, local, width)


def _by_group(of_row: I64, groups: int, offset: int) -> list[npt.NDArray[np.intp]]:
    """Per group, the positions (``offset`` + request index) of its requests' users."""
    order = np.argsort(of_row, kind="stable")
    bounds = np.searchsorted(of_row[order], np.arange(groups + 1))
    return [(order[bounds[g] : bounds[g + 1]] + offset).astype(np.intp) for g in range(groups)]


def _codes(values: list[str]) -> tuple[list[str], I64]:
    """The distinct values in first-seen order, and each value's index among them."""
    codes: dict[str, int] = {}
    coded = [codes.setdefault(v, len(codes)) for v in values]
    return list(codes), np.array(coded, dtype=np.int64)


def _groups(
    layout: AggregateLayout, window: int, deadlines: I64, variant: I64, n_variants: int
) -> tuple[list[tuple[int, int]], I64]:
    """The distinct (bucket start, variant code) of the requests, and each one's group."""
    width = layout.bucket_width(window)
    bucket = deadlines // width  # bucket starts are multiples of the width
    first = int(bucket.min()) if len(bucket) else 0
    keys, of_row = np.unique((bucket - first) * n_variants + variant, return_inverse=True)
    groups = [((first + c // n_variants) * width, c % n_variants) for c in keys.tolist()]
    return groups, of_row.reshape(-1)


def _catalogue(
    out: CoverageUpdate,
    layout: AggregateLayout,
    key: SketchKey,
    tops: dict[int, list[str]],
    *,
    deadlines: I64,
    row: I64,
    level: I64,
) -> None:
    """The catalogue sketch of each longest-window bucket: every item shown is in some
    variant's top max(K) sketch of that bucket (``tops``, held as a union) or beyond
    max(K) (added)."""
    longest = max(layout.windows_ms)
    beyond = np.flatnonzero(level == len(layout.ks))
    width = layout.bucket_width(longest)
    start_of = (deadlines[row[beyond]] // width) * width
    added = {s: beyond[start_of == s] for s in np.unique(start_of).tolist()}
    for start in sorted(set(tops) | set(added)):
        catalogue = key(longest, start, "*", 0)
        out.sketches[catalogue] = (added.get(start, _NOTHING), tops.get(start, []))


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


def history_increments(
    finalised: Finalised, layout: AggregateLayout
) -> dict[HistoryKey, FloatArray]:
    """The regression detector's per-slot sums that the requests add, per (hour,
    variant) (none when the layout keeps no history)."""
    if not layout.history_keep_ms or not len(finalised):
        return {}
    rules = RegressionRules(ks=layout.ks, slot_ms=layout.history_slot_ms)
    rows = finalised.rows[:, row_columns(layout.schema, layout.ks)]
    out = slot_sums(rules, finalised.deadline_ms, finalised.due.variant, rows)
    if finalised.maturity is not None:
        final = (rows[:, 2::2], rows[:, 1] > 0)  # nDCG@K per K, engaged
        variants = variant_codes(finalised.due.variant)
        out |= maturity_increments(finalised.deadline_ms, variants, final, finalised.maturity)
    return out


def history_shape(layout: AggregateLayout, name: str) -> tuple[int, int]:
    """A stored history array's shape: an hour of slots, or a maturity array's ages and
    the final row (:mod:`evaluator.core.maturity`), by cutoff columns."""
    rules = RegressionRules(ks=layout.ks, slot_ms=layout.history_slot_ms)
    if is_maturity(name):
        return len(layout.maturity_ages_ms) + 1, rules.width
    return rules.slots_per_hour, rules.width


def history_prefixes(layout: AggregateLayout) -> tuple[str, str]:
    """The stored names' prefixes of the history, and of the maturity arrays: the slot
    or the ages, and the cutoffs (another setting starts anew; a reader of a version
    without maturity arrays does not see them)."""
    ks = ",".join(map(str, layout.ks))
    ages = ",".join(map(str, layout.maturity_ages_ms))
    return f"{layout.history_slot_ms}/{ks}:", f"m{ages}/{ks}:"


def history_name(layout: AggregateLayout, key: HistoryKey) -> str:
    """A history array's stored name: its prefix, hour and variant."""
    prefix = history_prefixes(layout)[1 if is_maturity(key[1]) else 0]
    return f"{prefix}{key[0]}:{key[1]}"


def _longer_start(layout: AggregateLayout, window_ms: int, start_ms: int) -> int:
    """Start of the ``window_ms`` bucket holding the bucket that starts at ``start_ms``."""
    return int(layout.bucket_start(window_ms, np.array([start_ms], dtype=np.int64))[0])
