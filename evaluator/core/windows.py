"""Sliding event-time windows and the layout of their sufficient statistics.

Each window (default 5m, 1h, 24h) is kept as ``buckets_per_window`` buckets
aligned to the epoch. A finalised request lands in one bucket per window,
chosen by its *finalisation time* (impression time + attribution window + clock
skew + allowed lateness), so a window holds "the requests finalised in it".

A bucket holds, per variant, a float64 block of shape ``(2 cohorts, local user
buckets, row width)``. A row is ``[count, engaged, sum of each metric@K...,
sum of squares of each metric@K..., lists with a diversity@K..., sum of
diversity@K..., requests with a shadow ranking, sum of RBO with it]``.
Users are hashed into ``user_buckets``;
bucket ``b`` lives in shard ``b % shards`` at local index ``b // shards``, so a
shard's blocks only carry its own users and summing shards loses nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from evaluator.core.scoring import METRICS, RequestScores
from evaluator.core.sketch import hash_strings

FloatArray = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

COHORT_INDEX = {"cold_start": 0, "established": 1}


@dataclass(frozen=True, slots=True)
class AggregateLayout:
    """Shapes and key arithmetic shared by every state store."""

    ks: tuple[int, ...]
    windows_ms: tuple[int, ...] = (300_000, 3_600_000, 86_400_000)
    buckets_per_window: int = 12
    user_buckets: int = 128
    shards: int = 16
    metrics: tuple[str, ...] = METRICS

    def __post_init__(self) -> None:
        if self.user_buckets % self.shards:
            raise ValueError("user_buckets must be a multiple of shards")

    @property
    def n_values(self) -> int:
        return len(self.metrics) * len(self.ks)

    @property
    def row_width(self) -> int:
        return 2 + 2 * self.n_values + 2 * len(self.ks) + 2

    def rbo_columns(self) -> tuple[int, int]:
        """Row columns of (requests with a shadow ranking, sum of their RBO)."""
        return self.row_width - 2, self.row_width - 1

    def diversity_columns(self, k: int) -> tuple[int, int]:
        """Row columns of (lists with a diversity@k, sum of diversity@k)."""
        i = self.ks.index(k)
        base = 2 + 2 * self.n_values
        return base + i, base + len(self.ks) + i

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

    def fingerprint(self) -> str:
        """Identifies the block layout; stored state with another layout is refused."""
        return json.dumps(
            {
                "ks": self.ks,
                "metrics": self.metrics,
                "user_buckets": self.user_buckets,
                "shards": self.shards,
                "windows_ms": self.windows_ms,
                "buckets_per_window": self.buckets_per_window,
            },
            sort_keys=True,
        )

    def columns(self) -> list[tuple[str, int]]:
        """(metric, k) of each value column, in row order after count and engaged."""
        return RequestScores.columns(self.ks)


def user_buckets(user_ids: Sequence[str], layout: AggregateLayout) -> I64:
    """Stable user bucket of each user (the same in every process)."""
    hashes = hash_strings(list(user_ids))
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
    scores: RequestScores, diversity: FloatArray, overlap: FloatArray
) -> FloatArray:
    """One statistics row per request (see the module docstring for the columns).

    ``diversity`` has one column per K and ``overlap`` one value per request (RBO
    with the shadow ranking), NaN where undefined.
    """
    values = scores.matrix()
    n = values.shape[0]
    defined = np.isfinite(diversity)
    has_rbo = np.isfinite(overlap)
    return np.hstack(
        [
            np.ones((n, 1)),
            scores.engaged.astype(np.float64)[:, None],
            values,
            values * values,
            defined.astype(np.float64),
            np.where(defined, diversity, 0.0),
            has_rbo.astype(np.float64)[:, None],
            np.where(has_rbo, overlap, 0.0)[:, None],
        ]
    )


def empty_block(layout: AggregateLayout) -> FloatArray:
    return np.zeros(layout.block_shape)


def expand_shards(blocks: dict[int, FloatArray], layout: AggregateLayout) -> FloatArray:
    """Per-shard blocks -> one ``(2, user_buckets, row_width)`` array."""
    full = np.zeros((2, layout.user_buckets, layout.row_width))
    for shard, block in blocks.items():
        full[:, shard :: layout.shards, :] += block
    return full
