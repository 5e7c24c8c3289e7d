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
enter the comparison. How many fewer users it needs than an A/B test on nDCG
therefore depends on how much users differ (BENCHMARKS.md, tests/test_interleaving.py):
none where users click alike, about 8x per arm (15x in all) where their click
propensity is lognormal with σ = 1.5.

Randomisation is by request (the coin), but a user's requests are correlated, so the
unit of the variance is the user bucket, as in :mod:`evaluator.core.ab.stats`: per
bucket the sum of outcomes and the count of informative requests, a ratio-of-sums
mean with its delta-method variance, and the same always-valid interval and
p-value as the A/B difference (against a preference of 0).

Stored, an interleaved list is its *draft* (:func:`draft`): the two rankers' names
in sorted order and the team of each position as one string, which repeats (team
draft makes at most 2^(k/2) patterns of k positions), so the engine codes it like a
variant. An experiment's cumulative statistics keep each ranker pair beside its
variants, under the pair's key (:func:`pair_key`), in its columns of the
statistics row (:data:`evaluator.core.rows.INTERLEAVING`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

T = TypeVar("T", bound=Hashable)
I64 = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

TEAM_A, TEAM_B = 0, 1
PAIR = "\x1e"
"""Between the two rankers' names in a pair's key and a draft (a character no
identifier may hold: a pair's key never equals a variant)."""
NONE = -2
"""The outcome of a request that tells nothing (not interleaved, or no credit)."""
DRAFT_POSITIONS = 64
"""Positions a draft keeps (and credits): interleaving compares the top of a list, and
a cap bounds what a producer sending a new team pattern with every long list costs
the codebook (its drafts stay coded until the book is rebuilt)."""


def draft(teams: Sequence[str], rankers: Mapping[str, str]) -> str:
    """An interleaved list's draft: the rankers' names in sorted order, then per position
    (the first :data:`DRAFT_POSITIONS`) ``0`` (the first name's pick) or ``1``;
    ``teams``: each position's team, a key of ``rankers`` (two teams, two different
    names)."""
    first, second = sorted(rankers.values())
    bit = {team: "0" if name == first else "1" for team, name in rankers.items()}
    picks = "".join(map(bit.__getitem__, teams[:DRAFT_POSITIONS]))
    return first + PAIR + second + PAIR + picks


def pair_key(first: str, second: str) -> str:
    """The key of a ranker pair among an experiment's arms (names in sorted order)."""
    return first + PAIR + second


def is_pair(arm: str) -> bool:
    return PAIR in arm


def rankers(key: str) -> tuple[str, str]:
    """The two names of a pair's key."""
    first, _, second = key.partition(PAIR)
    return first, second


@dataclass(frozen=True, slots=True)
class Credited:
    """Each request's ranker pair (an index into :attr:`pairs`, -1: not interleaved)
    and outcome (+1: the pair's second ranker won, -1: the first, 0: a tie, :data:`NONE`)."""

    pairs: list[str]
    pair: I64
    outcome: I64


def credit(drafts: Sequence[str], row: I64, position: I64, grade: FloatArray) -> Credited:
    """The outcomes of requests (their drafts, "" when not interleaved) from their
    attributed interactions (``row``, 0-based ``position``, ``grade``: the join's)."""
    n = len(drafts)
    labels = sorted(set(drafts) - {""}) if any(drafts) else []
    if not labels:
        return Credited([], np.full(n, -1, np.int64), np.full(n, NONE, np.int64))
    code = {label: i for i, label in enumerate(labels)}
    of_row = np.fromiter(map(code.get, drafts, [-1] * n), dtype=np.int64, count=n)
    heads = [label.rpartition(PAIR) for label in labels]
    pairs = sorted({head for head, _, _ in heads})
    pair_of = np.asarray([pairs.index(head) for head, _, _ in heads] + [-1], dtype=np.int64)
    width = max(len(bits) for _, _, bits in heads)
    patterns = np.full((len(labels) + 1, width), -1, dtype=np.int8)  # last: not interleaved
    for i, (_, _, bits) in enumerate(heads):
        patterns[i, : len(bits)] = np.frombuffer(bits.encode(), dtype=np.uint8) - ord("0")
    out = outcomes(patterns[of_row], row, position, grade)
    return Credited(pairs, pair_of[of_row], out)


def add_outcomes(
    block_of: Callable[[str], FloatArray],
    credited: Credited,
    rows: npt.NDArray[np.intp],
    at: tuple[I64, I64],
    columns: tuple[int, int, int],
) -> None:
    """Add the informative ones among ``rows`` to their pair's block (``block_of(key)``,
    indexed ``[cohort, user bucket, column]``); ``at``: every request's cohort and
    bucket; ``columns``: where :data:`~evaluator.core.rows.INTERLEAVING` are in the row."""
    mine = rows[credited.outcome[rows] != NONE]
    if not mine.size:
        return
    total, requests, wins = columns
    for p in np.unique(credited.pair[mine]).tolist():
        picked = mine[credited.pair[mine] == p]
        block = block_of(credited.pairs[p])
        where = (at[0][picked], at[1][picked])
        result = credited.outcome[picked].astype(np.float64)
        np.add.at(block[..., total], where, result)
        np.add.at(block[..., requests], where, 1.0)
        np.add.at(block[..., wins], where, (result > 0).astype(np.float64))


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


def team_drafts(
    a: npt.NDArray[np.int64], b: npt.NDArray[np.int64], rng: random.Random
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int8]]:
    """Rankings of equal length, one per row, drafted row by row (:func:`team_draft`):
    the lists, and each position's team (a simulator's, not a hot path)."""
    k = a.shape[1]
    lists = np.zeros(a.shape, dtype=np.int64)
    teams = np.zeros(a.shape, dtype=np.int8)
    for r, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        items, team = team_draft(x, y, k, rng)
        lists[r, : len(items)], teams[r, : len(team)] = items, team
    return lists, teams


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
    out[(wins_a + wins_b) == 0] = NONE
    return out


__all__ = [
    "DRAFT_POSITIONS",
    "NONE",
    "PAIR",
    "TEAM_A",
    "TEAM_B",
    "Credited",
    "add_outcomes",
    "credit",
    "draft",
    "is_pair",
    "outcomes",
    "pair_key",
    "rankers",
    "team_draft",
    "team_drafts",
]
