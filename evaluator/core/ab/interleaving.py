"""Team-draft interleaving: which of two rankers users prefer, from one list each. Pure.

Team draft (Radlinski, Kurup & Joachims 2008, "How does clickthrough data reflect
retrieval quality?"): the two rankers take turns, a coin deciding who picks first in
each round, and each adds its highest-ranked item not yet in the list; every
position remembers the team that contributed it. A user's relevant interactions
(clicks, carts, purchases: any positive grade) are credited to the teams of the
positions they hit. A request prefers the team with more credited interactions; one
with none tells nothing and is left out, one with equal credit is a tie.

The preference is the mean outcome over informative requests, ``+1`` when ranker B
wins, ``-1`` when A wins, ``0`` for a tie: ``Δ = (wins_B − wins_A) / n``, so the
share of requests preferring B among the decided ones is ``(1 + Δ)/2`` over the
ties' share (Chapelle, Joachims, Radlinski & Yue 2012, "Large-scale validation and
analysis of interleaved search evaluation", whose Δ_AB is half of it). Both rankers
are seen by every user, so differences between users (how much they click) do not
enter the comparison. Whether that makes it need fewer users than an A/B test on
nDCG depends on how much users differ: in the simulator's world, where they differ
only by segment and activity, team draft needed more users than the A/B test; with
users whose click propensities differ (lognormal, σ = 1) about 10× fewer. That
comparison is not settled here.

Randomisation is by request (the coin), but a user's requests are correlated, so the
unit of the variance is the user bucket, as in :mod:`evaluator.core.ab.stats`: per
bucket the sum of outcomes and the count of informative requests, a ratio-of-sums
mean with its delta-method variance, and the same always-valid interval and
p-value as the A/B difference (against a preference of 0).
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.stats import (
    DiffResult,
    RatioEstimate,
    fixed_horizon,
    ratio_estimate,
    sequential,
)

T = TypeVar("T", bound=Hashable)
I64 = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

TEAM_A, TEAM_B = 0, 1


def team_draft(
    a: Sequence[T], b: Sequence[T], k: int, rng: random.Random
) -> tuple[list[T], list[int]]:
    """The interleaved list of at most ``k`` items of rankings ``a`` and ``b``, and the
    team (:data:`TEAM_A` or :data:`TEAM_B`) of each position."""
    items: list[T] = []
    teams: list[int] = []
    used: set[T] = set()
    at = [0, 0]
    picked = [0, 0]
    rankings = (a, b)
    while len(items) < k:
        for team in (TEAM_A, TEAM_B):
            ranking = rankings[team]
            while at[team] < len(ranking) and ranking[at[team]] in used:
                at[team] += 1
        left = [at[t] < len(rankings[t]) for t in (TEAM_A, TEAM_B)]
        if not any(left):
            break
        team = TEAM_A if picked[TEAM_A] < picked[TEAM_B] else TEAM_B
        if picked[TEAM_A] == picked[TEAM_B]:
            team = TEAM_A if rng.random() < 0.5 else TEAM_B
        if not left[team]:
            team = 1 - team
        item = rankings[team][at[team]]
        items.append(item)
        teams.append(team)
        used.add(item)
        picked[team] += 1
    return items, teams


def outcomes(teams: npt.NDArray[np.int8], row: I64, position: I64, grade: FloatArray) -> I64:
    """Each request's outcome from its attributed interactions (``row``, 0-based
    ``position`` and ``grade``, as the join gives them): +1 when team B earned more
    credited interactions, -1 when A did, 0 for a tie, and -2 when none was credited
    (an uninformative request). ``teams``: per request and position (-1: padding)."""
    rows = teams.shape[0]
    credited = np.asarray(grade) > 0
    row, position = row[credited], position[credited]
    inside = position < teams.shape[1]
    row, position = row[inside], position[inside]
    team = teams[row, position]
    wins_b = np.bincount(row[team == TEAM_B], minlength=rows)
    wins_a = np.bincount(row[team == TEAM_A], minlength=rows)
    out: I64 = np.sign(wins_b - wins_a).astype(np.int64)
    out[(wins_a + wins_b) == 0] = -2
    return out


def bucket_sums(outcome: I64, user_bucket: I64, buckets: int) -> tuple[FloatArray, FloatArray]:
    """Per user bucket: the sum of the informative requests' outcomes, and their count."""
    informative = outcome != -2
    at = user_bucket[informative]
    sums = np.bincount(at, weights=outcome[informative], minlength=buckets).astype(np.float64)
    counts = np.bincount(at, minlength=buckets).astype(np.float64)
    return sums, counts


@dataclass(frozen=True, slots=True)
class Preference:
    """Ranker B's preference over A: the mean outcome Δ in [-1, 1] (positive: B
    preferred), its interval and p-value, and the share of decided requests won by B."""

    delta: float
    lower: float
    upper: float
    p_value: float
    share_b: float
    """Wins of B over the decided (non-tied) informative requests."""
    requests: float
    """Informative requests."""


_NONE = RatioEstimate(0.0, 0.0, 0.0)
"""The null preference, as a known control (no variance, no observations)."""


def preference(
    sums: FloatArray,
    counts: FloatArray,
    wins_b: float,
    decided: float,
    *,
    method: str = "sequential",
    alpha: float = 0.05,
    tuning: float = 5000.0,
) -> Preference:
    """The preference from per-bucket sums (see :func:`bucket_sums`), with the
    always-valid interval and p-value (``method="sequential"``, valid at every look)
    or the one-look one (``"fixed"``). ``wins_b`` and ``decided``: the counts behind
    the exported share."""
    estimate = ratio_estimate(sums, counts)
    result: DiffResult = (
        sequential(_NONE, estimate, alpha, tuning)
        if method == "sequential"
        else fixed_horizon(_NONE, estimate, alpha)
    )
    share = wins_b / decided if decided > 0 else math.nan
    return Preference(
        result.diff, result.lower, result.upper, result.p_value, share, estimate.count
    )


__all__ = ["TEAM_A", "TEAM_B", "Preference", "bucket_sums", "outcomes", "preference", "team_draft"]
