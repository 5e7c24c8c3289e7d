"""Team-draft interleaving against simulated ground truth: two rankers of known quality
in the simulator's world (latent item relevance per user segment, a position-based
click model), their lists interleaved for each request."""

from __future__ import annotations

import random

import numpy as np
import pytest

from evaluator.core.ab.interleaving import (
    TEAM_A,
    TEAM_B,
    bucket_sums,
    outcomes,
    preference,
    team_draft,
)

ITEMS, SEGMENTS, SHOWN, BUCKETS = 200, 8, 10, 128
EXAMINE = 1.0 / np.arange(1, SHOWN + 1)
"""The chance a user examines each position (position-based click model)."""


class World:
    """The simulator's world (:mod:`evaluator.core.simulator`): items of latent
    relevance ``z`` per user segment, clicked with probability ``sigmoid(1.6 z - 2)``
    when examined; ranker ``X`` orders them by ``z`` plus Gaussian noise of scale
    ``noise[X]`` (less: better). Users make a heavy-tailed number of requests."""

    def __init__(self, seed: int, noise_a: float, noise_b: float) -> None:
        self.rng = np.random.default_rng(seed)
        self.coin = random.Random(seed)
        self.noise = (noise_a, noise_b)
        self.latent = self.rng.standard_normal((SEGMENTS, ITEMS))
        self.gamma = 1.0 / (1.0 + np.exp(-(1.6 * self.latent - 2.0)))

    def users(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Each request's user (0..n-1, in order) and segment."""
        counts = np.minimum(np.ceil(self.rng.lognormal(0.3, 1.0, n)), 50).astype(np.int64)
        user = np.repeat(np.arange(n), counts)
        return user, self.rng.integers(0, SEGMENTS, n)[user]

    def top(self, segment: np.ndarray, noise: float) -> np.ndarray:
        scores = self.latent[segment] + noise * self.rng.standard_normal((segment.size, ITEMS))
        top = np.argpartition(-scores, SHOWN - 1, axis=1)[:, :SHOWN]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        return np.take_along_axis(top, order, axis=1)

    def clicks(self, segment: np.ndarray, shown: np.ndarray) -> np.ndarray:
        gamma = self.gamma[segment[:, None], shown]
        return self.rng.random(shown.shape) < gamma * EXAMINE

    def interleaved(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` users' interleaved requests: each request's user and outcome."""
        user, segment = self.users(n)
        top_a, top_b = (self.top(segment, noise).tolist() for noise in self.noise)
        teams = np.full((user.size, SHOWN), -1, dtype=np.int8)
        shown = np.zeros((user.size, SHOWN), dtype=np.int64)
        for r in range(user.size):
            items, team = team_draft(top_a[r], top_b[r], SHOWN, self.coin)
            shown[r, : len(items)], teams[r, : len(team)] = items, team
        row, position = np.nonzero(self.clicks(segment, shown))
        return user, outcomes(teams, row, position, np.ones(row.size))


def test_team_draft_alternates_fairly_and_keeps_each_ranking_order() -> None:
    coin = random.Random(1)
    a, b = list("abcdefgh"), list("bdafhceg")
    for _ in range(200):
        items, teams = team_draft(a, b, 6, coin)
        assert len(items) == len(set(items)) == 6
        picks = [teams.count(TEAM_A), teams.count(TEAM_B)]
        assert abs(picks[0] - picks[1]) <= 1 and all(
            abs(teams[: 2 * i + 2].count(TEAM_A) - (i + 1)) <= 1 for i in range(3)
        )
        for team, ranking in ((TEAM_A, a), (TEAM_B, b)):
            mine = [x for x, t in zip(items, teams, strict=True) if t == team]
            assert [ranking.index(x) for x in mine] == sorted(ranking.index(x) for x in mine)
            for x in mine:  # each pick is the best of its ranking not already shown
                before = items[: items.index(x)]
                assert all(y in before for y in ranking[: ranking.index(x)])
    firsts = [team_draft(a, b, 2, coin)[1][0] for _ in range(2000)]
    assert 0.45 < firsts.count(TEAM_A) / 2000 < 0.55  # the coin decides who starts


def test_outcomes_credit_each_relevant_interaction_to_its_team() -> None:
    teams = np.array([[0, 1, 1, 0], [1, 0, -1, -1], [0, 1, 0, 1], [0, 1, 0, 1]], np.int8)
    row = np.array([0, 0, 0, 1, 2, 2, 3])
    position = np.array([1, 2, 3, 1, 0, 1, 2])
    grade = np.array([1.0, 3.0, 1.0, 2.0, 1.0, 1.0, 0.0])  # a grade of 0 credits nothing
    assert outcomes(teams, row, position, grade).tolist() == [1, -1, 0, -2]
    sums, counts = bucket_sums(np.array([1, -1, 0, -2]), np.array([0, 1, 1, 0]), 2)
    assert sums.tolist() == [1.0, -1.0] and counts.tolist() == [1.0, 2.0]


def run_experiments(world: World, experiments: int, users: int, looks: int) -> tuple[float, float]:
    """Share of experiments the always-valid preference flags (p < 0.05) at some look
    (looks spread over the users, in order of arrival), and the median share of B wins
    at the end."""
    flagged, shares = 0, []
    for _ in range(experiments):
        user, out = world.interleaved(users)
        bucket = user % BUCKETS
        hit = False
        for look in np.linspace(users / looks, users, looks).astype(int):
            seen = user < look
            sums, counts = bucket_sums(out[seen], bucket[seen], BUCKETS)
            decided = out[seen][(out[seen] != -2) & (out[seen] != 0)]
            found = preference(sums, counts, float((decided == 1).sum()), float(decided.size))
            hit = hit or found.p_value < 0.05
        flagged += hit
        shares.append(found.share_b)
    return flagged / experiments, float(np.median(shares))


def test_a_better_ranker_is_preferred_and_found() -> None:
    """Ranker B much better than A (the simulator's default noises, 0.4 against 1.0):
    the always-valid test flags B in every experiment of 1,000 users, and B wins most
    decided requests."""
    rate, share = run_experiments(World(5, noise_a=1.0, noise_b=0.4), 20, 1_000, looks=10)
    assert rate == 1.0 and share > 0.6


@pytest.mark.parametrize("seed", [7])
def test_an_aa_interleaving_is_flagged_in_at_most_5_percent_over_50_looks(seed: int) -> None:
    """Two rankers of equal quality (independent noise): the always-valid p-value read
    at 50 looks falls below 0.05 in at most 5% of experiments."""
    world = World(seed, noise_a=0.2, noise_b=0.2)
    rate, share = run_experiments(world, 200, 1_500, looks=50)
    print(f"A/A: flagged in {rate:.1%} of 200 experiments; B's median share {share:.2f}")
    assert rate <= 0.05
    assert 0.45 < share < 0.55
