"""Sliding event-time windows and the layout of their sufficient statistics.

Each window (default 5m, 1h, 24h) is kept as ``buckets_per_window`` buckets
aligned to the epoch. A finalised request lands in one bucket per window,
chosen by its *finalisation time* (impression time + attribution window + clock
skew + allowed lateness), so a window holds "the requests finalised in it".

A bucket holds, per variant, a float64 block of shape ``(2 cohorts, local user
buckets, row width)``; a row's columns are named (:mod:`evaluator.core.rows`).
Users are hashed into ``user_buckets``;
bucket ``b`` lives in shard ``b % shards`` at local index ``b // shards``, so a
shard's blocks only carry its own users and summing shards loses nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from evaluator.core.rows import COVARIATE, INTERLEAVING, RowSchema, fresh_columns, widen
from evaluator.core.scoring import METRICS, RequestScores
from evaluator.core.sketch import hash_strings

FloatArray = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

COHORT_INDEX = {"cold_start": 0, "established": 1}


def block_ttl_s(window_ms: int) -> int:
    """How long a window's stored block or sketch lives after its last write (wall
    clock): two window lengths and an hour, so a stalled pipeline's window is still
    whole when it resumes; event time prunes sooner (the stores drop blocks two window
    lengths behind the newest written)."""
    return (2 * window_ms) // 1000 + 3600


@dataclass(frozen=True, slots=True)
class AggregateLayout:
    """Shapes and key arithmetic shared by every state store."""

    ks: tuple[int, ...]
    windows_ms: tuple[int, ...] = (300_000, 3_600_000, 86_400_000)
    buckets_per_window: int = 12
    user_buckets: int = 128
    shards: int = 16
    column_names: tuple[str, ...] = ()
    """The stored row layout (:mod:`evaluator.core.rows`); empty: a fresh one for
    ``ks`` and every registered metric."""
    history_slot_ms: int = 300_000
    """The regression detector's slot (:mod:`evaluator.core.regression`)."""
    history_keep_ms: int = 0
    """How long the stores keep its per-slot history, by event time (0: none kept)."""
    provisional_ms: int = 0
    """Requests are scored early this long after their impression (0: never)."""
    provisional_age_ms: int = 0
    """... with the interactions of their first this many ms."""
    provisional_key_ms: int = 0
    """... into the history slot of their impression time plus this (whole slots before
    their deadline: see :mod:`evaluator.core.provisional`)."""
    maturity_ages_ms: tuple[int, ...] = ()
    """Finalised requests are also scored at these ages for the maturity curve
    (:mod:`evaluator.core.maturity`; kept with the history)."""
    schema: RowSchema = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.user_buckets % self.shards:
            raise ValueError("user_buckets must be a multiple of shards")
        if not self.column_names:
            object.__setattr__(self, "column_names", fresh_columns(self.ks, METRICS))
        object.__setattr__(self, "schema", RowSchema(self.column_names))

    @property
    def row_width(self) -> int:
        return len(self.column_names)

    def columns(self) -> list[tuple[str, int]]:
        """(metric, k) of each value column, in row order after count and engaged: a
        fresh layout's positions (a grown one is read by name, through ``schema``)."""
        if self.column_names != fresh_columns(self.ks, METRICS):
            raise ValueError("a grown layout has no positional columns: use its schema")
        return RequestScores.columns(self.ks)

    def rbo_columns(self) -> tuple[int, int]:
        """Row columns of (requests with a shadow ranking, sum of their RBO)."""
        return self.schema.index("rbo_lists"), self.schema.index("rbo_sum")

    def diversity_columns(self, k: int) -> tuple[int, int]:
        """Row columns of (lists with a diversity@k, sum of diversity@k)."""
        return self.schema.index(f"div_lists@{k}"), self.schema.index(f"div_sum@{k}")

    @property
    def local_buckets(self) -> int:
        return self.user_buckets // self.shards

    @property
    def block_shape(self) -> tuple[int, int, int]:
        return (2, self.local_buckets, self.row_width)

    def bucket_width(self, window_ms: int) -> int:
        return max(1, window_ms // self.buckets_per_window)

    def bucket_start(self, window_ms: int, t_ms: I64) -> I64:
        width = self.bucket_width(window_ms)
        return t_ms - np.mod(t_ms, width)

    def sketch_source(self, window_ms: int) -> int | None:
        """The window whose bucket sketches this window's hold the union of, if any.

        Items are placed in the shortest window's sketches only; a longer window
        whose bucket width is a multiple of the shortest's holds their union (each
        short bucket lies inside one long bucket), which costs a register maximum
        per bucket instead of every item once more. None: fed directly."""
        shortest = min(self.windows_ms)
        if window_ms == shortest:
            return None
        if self.bucket_width(window_ms) % self.bucket_width(shortest):
            return None
        return shortest

    def structure(self) -> dict[str, Any]:
        """What stored blocks and keys depend on beside their columns: state with
        another structure cannot be read."""
        return {  # the partition count first: it changes user_buckets' rounding too
            "shards": self.shards,
            "user_buckets": self.user_buckets,
            "windows_ms": list(self.windows_ms),
            "buckets_per_window": self.buckets_per_window,
        }

    def fingerprint(self) -> str:
        """The stored description of the layout: its structure and named columns."""
        return json.dumps({**self.structure(), "columns": list(self.column_names)}, sort_keys=True)


_STRUCTURE_SETTING = {
    "user_buckets": "windows.user_buckets",
    "shards": "the partition count of the input topics",
    "windows_ms": "windows.sizes (ms)",
    "buckets_per_window": "windows.buckets_per_window",
}


class LayoutRefusedError(ValueError):
    """Stored state this layout cannot read or convert; the message says what changed."""


def resume(layout: AggregateLayout, stored: str | None) -> AggregateLayout:
    """The layout to run with over state stored with fingerprint ``stored`` (None or
    empty: no state yet, ``layout`` itself).

    Columns this version adds are appended (a new generation); the stored ones
    keep their place, so every block written before stays readable. Fingerprints
    from before named columns (``ks`` and ``metrics``) describe the fresh layout of
    those. A different structure, or a stored column this version would no longer
    write, raises :class:`LayoutRefusedError`."""
    if not stored:
        return layout
    old = json.loads(stored)
    for key, now in layout.structure().items():
        if old.get(key) != now:
            was = old.get(key)
            raise LayoutRefusedError(f"{_STRUCTURE_SETTING[key]} was {was} and is now {now}")
    if "columns" in old:
        columns = tuple(old["columns"])
    else:  # written before named columns
        columns = fresh_columns(old["ks"], old["metrics"])
    kept = RowSchema(columns)
    dropped = kept.missing(layout.schema)
    if dropped:
        raise LayoutRefusedError(
            f"with columns this configuration no longer computes ({', '.join(dropped[:4])}"
            f"{', ...' if len(dropped) > 4 else ''}; a cutoff removed from metrics.k?)"
        )
    return replace(layout, column_names=kept.grown(layout.schema).names)


def user_buckets(user_ids: Sequence[str], layout: AggregateLayout) -> I64:
    """Stable user bucket of each user (the same in every process)."""
    return hash_buckets(hash_strings(list(user_ids)), layout)


def hash_buckets(hashes: npt.NDArray[np.uint64], layout: AggregateLayout) -> I64:
    """:func:`user_buckets` of users given by their stable hashes."""
    return (hashes % np.uint64(layout.user_buckets)).astype(np.int64)


def partition_user_buckets(user_ids: Sequence[str], layout: AggregateLayout, partition: int) -> I64:
    """User buckets of users owned by one partition (shard ``partition``): bucket
    ``partition + shards * (hash % local_buckets)``, so every row a partition writes
    lands in its own shard's blocks and partitions never write the same block."""
    hashes = hash_strings(list(user_ids))
    local = (hashes % np.uint64(layout.local_buckets)).astype(np.int64)
    return partition + layout.shards * local


def shard_of(user_ids: Sequence[str], layout: AggregateLayout) -> I64:
    """The state shard of each user: all of a user's state shares one hash tag."""
    return user_buckets(user_ids, layout) % layout.shards


def contribution_rows(
    scores: RequestScores,
    diversity: FloatArray,
    overlap: FloatArray,
    schema: RowSchema | None = None,
) -> FloatArray:
    """One statistics row per request, in ``schema``'s column order (default: a fresh
    layout for the scores' cutoffs).

    ``diversity`` has one column per K and ``overlap`` one value per request (RBO
    with the shadow ranking), NaN where undefined.
    """
    values = scores.matrix()
    n = values.shape[0]
    defined = np.isfinite(diversity)
    has_rbo = np.isfinite(overlap)
    rows = np.hstack(
        [
            np.ones((n, 1)),
            scores.engaged.astype(np.float64)[:, None],
            values,
            values * values,
            defined.astype(np.float64),
            np.where(defined, diversity, 0.0),
            has_rbo.astype(np.float64)[:, None],
            np.where(has_rbo, overlap, 0.0)[:, None],
            np.zeros((n, len(COVARIATE))),  # per exposed user, not per request
            np.zeros((n, len(INTERLEAVING))),  # a ranker pair's, not a variant's
        ]
    )
    if schema is None:
        return rows
    return schema.assemble(fresh_columns(scores.ks, METRICS), rows)


def stored_block(raw: bytes, layout: AggregateLayout) -> FloatArray:
    """A block read back from its little-endian doubles. One written before columns
    were added is narrower: it reads with zeros in them (:func:`evaluator.core.rows.widen`)."""
    flat = np.frombuffer(raw, dtype="<f8")
    rows = 2 * layout.local_buckets
    return widen(flat.reshape(2, layout.local_buckets, flat.size // rows), layout.row_width)


def empty_block(layout: AggregateLayout) -> FloatArray:
    return np.zeros(layout.block_shape)


def expand_shards(blocks: dict[int, FloatArray], layout: AggregateLayout) -> FloatArray:
    """Per-shard blocks -> one ``(2, user_buckets, row_width)`` array."""
    full = np.zeros((2, layout.user_buckets, layout.row_width))
    for shard, block in blocks.items():
        full[:, shard :: layout.shards, :] += block
    return full
