"""Team-draft interleaving against simulated ground truth: two rankers of known quality
in the simulator's world (latent item relevance per user segment, a position-based
click model), their lists interleaved for each request, read through
:func:`~evaluator.core.ab.readout.read_experiment` (the registered collector's readout)
from blocks built by the engine's own functions (drafts, credit, per-bucket sums).

The comparison with an A/B test on nDCG@10 runs on the same ground truth, in a world
where users differ in how much they click (a lognormal propensity per user, σ = 1.5):
there interleaving reaches the A/B test's power with a tenth of its users (about an
eighth of its users per arm). Where users click alike it needs about as many."""

from __future__ import annotations

import random

import numpy as np
import pytest

from evaluator.core.ab.interleaving import (
    DRAFT_POSITIONS,
    NONE,
    TEAM_A,
    TEAM_B,
    Credited,
    add_outcomes,
    credit,
    draft,
    outcomes,
    pair_key,
    team_draft,
)
from evaluator.core.ab.readout import ReadoutRules, read_experiment
from evaluator.core.ab.stats import SequentialTracker
from evaluator.core.decode import check_impression
from evaluator.core.events import Impression, InvalidReason
from evaluator.core.experiments import Experiment

ITEMS, SEGMENTS, SHOWN, BUCKETS = 200, 8, 10, 128
EXAMINE = 1.0 / np.arange(1, SHOWN + 1)
"""The chance a user examines each position (position-based click model)."""
GAIN = 1.0 / np.log2(np.arange(2, SHOWN + 2))
COLUMNS = {("ndcg", SHOWN): 2, ("ndcg_adjusted", SHOWN): 2}
"""Rows of the blocks here: requests, engaged, nDCG@10 sum, then a pair's outcome sum,
informative requests and the second ranker's wins."""
RULES = ReadoutRules((SHOWN,), COLUMNS, interleaving=(3, 4, 5))
PAIR = pair_key("a", "b")


class World:
    """The simulator's world (:mod:`evaluator.core.simulator`): items of latent
    relevance ``z`` per user segment, clicked with probability ``sigmoid(1.6 z - 2)``
    when examined; ranker ``X`` orders them by ``z`` plus Gaussian noise of scale
    ``noise[X]`` (less: better). Users make a heavy-tailed number of requests."""

    def __init__(self, seed: int, noise_a: float, noise_b: float, sigma: float = 0.0) -> None:
        self.rng = np.random.default_rng(seed)
        self.coin = random.Random(seed)
        self.noise = (noise_a, noise_b)
        self.sigma = sigma
        """Spread of the users' click propensity (lognormal, mean 1; 0: all alike)."""
        self.latent = self.rng.standard_normal((SEGMENTS, ITEMS))
        self.gamma = 1.0 / (1.0 + np.exp(-(1.6 * self.latent - 2.0)))

    def users(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each request's user (0..n-1, in order), segment and click propensity."""
        counts = np.minimum(np.ceil(self.rng.lognormal(0.3, 1.0, n)), 50).astype(np.int64)
        user = np.repeat(np.arange(n), counts)
        s = self.sigma
        propensity = np.exp(s * self.rng.standard_normal(n) - s * s / 2)
        return user, self.rng.integers(0, SEGMENTS, n)[user], propensity[user]

    def top(self, segment: np.ndarray, noise: float) -> np.ndarray:
        scores = self.latent[segment] + noise * self.rng.standard_normal((segment.size, ITEMS))
        top = np.argpartition(-scores, SHOWN - 1, axis=1)[:, :SHOWN]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        return np.take_along_axis(top, order, axis=1)

    def clicks(self, segment: np.ndarray, propensity: np.ndarray, shown: np.ndarray) -> np.ndarray:
        gamma = self.gamma[segment[:, None], shown] * propensity[:, None]
        return self.rng.random(shown.shape) < np.minimum(gamma, 1.0) * EXAMINE

    def interleaved(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` users' interleaved requests (ranker ``a``: team A): each request's user,
        and its outcome as the engine credits it (drafts, then :func:`credit`)."""
        user, segment, propensity = self.users(n)
        top_a, top_b = (self.top(segment, noise).tolist() for noise in self.noise)
        drafts, shown = [], np.zeros((user.size, SHOWN), dtype=np.int64)
        for r in range(user.size):
            items, team = team_draft(top_a[r], top_b[r], SHOWN, self.coin)
            shown[r] = items
            drafts.append(draft(["AB"[t] for t in team], {"A": "a", "B": "b"}))
        row, position = np.nonzero(self.clicks(segment, propensity, shown))
        credited = credit(drafts, row, position, np.ones(row.size))
        assert credited.pairs == [PAIR]
        return user, credited.outcome

    def ab(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` users split between rankers by a coin, each shown their ranker's list:
        each request's user, arm (0: ``a``) and nDCG@10 (a click is a gain of 1)."""
        user, segment, propensity = self.users(n)
        arm = (self.rng.random(n) < 0.5).astype(np.int64)[user]
        shown = np.zeros((user.size, SHOWN), dtype=np.int64)
        for side in (0, 1):
            mine = arm == side
            shown[mine] = self.top(segment[mine], self.noise[side])
        clicked = self.clicks(segment, propensity, shown)
        dcg = clicked @ GAIN
        ideal = np.concatenate([[0.0], np.cumsum(GAIN)])[clicked.sum(axis=1)]
        return user, arm, np.divide(dcg, ideal, out=np.zeros_like(dcg), where=ideal > 0)


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
    # the same through drafts: names sorted, so team A of "y" and B of "x" swap roles
    drafts = [draft(["AB"[t] for t in r[r >= 0]], {"A": "x", "B": "y"}) for r in teams]
    drafts[1] = draft(["A", "B"], {"A": "y", "B": "x"})  # the same rankers by position
    drafts.append("")  # not interleaved
    found = credit(drafts, row, position, grade)
    assert found.pairs == [pair_key("x", "y")]
    assert found.outcome.tolist() == [1, -1, 0, -2, -2] and found.pair.tolist() == [0] * 4 + [-1]
    block = np.zeros((1, 2, 3))
    add_outcomes(
        lambda _: block,
        found,
        np.arange(5),
        (np.zeros(5, np.int64), np.array([0, 1, 1, 0, 1])),
        (0, 1, 2),
    )
    assert block[0].tolist() == [[1.0, 1.0, 1.0], [-1.0, 2.0, 0.0]]


def pair_block(user: np.ndarray, outcome: np.ndarray) -> np.ndarray:
    """The pair's cumulative block over the given requests, as the engine adds it."""
    block = np.zeros((1, BUCKETS, 6))
    at = (np.zeros(user.size, dtype=np.int64), user % BUCKETS)
    add_outcomes(lambda _: block, credit_of(outcome), np.arange(user.size), at, (3, 4, 5))
    return block


def credit_of(outcome: np.ndarray) -> Credited:
    """Outcomes of one pair's requests as :func:`credit` gives them."""
    return Credited([PAIR], np.where(outcome != -2, 0, -1), outcome)


def read_pair(block: np.ndarray, tracker: SequentialTracker):
    readout = read_experiment(Experiment("x"), {PAIR: block}, {}, RULES, tracker)
    (found,) = readout.interleaving
    assert (found.first, found.second) == ("a", "b")
    return found


def run_experiments(world: World, experiments: int, users: int, looks: int) -> tuple[float, float]:
    """Share of experiments the always-valid preference flags (p < 0.05) at some look
    (looks spread over the users, in order of arrival), and the median share of B wins
    at the end."""
    flagged, shares = 0, []
    for _ in range(experiments):
        user, out = world.interleaved(users)
        tracker = SequentialTracker()
        hit = False
        for look in np.linspace(users / looks, users, looks).astype(int):
            seen = user < look
            found = read_pair(pair_block(user[seen], out[seen]), tracker)
            hit = hit or (found.ready and found.p_sequential < 0.05)
        flagged += hit
        shares.append(found.share_second)
    return flagged / experiments, float(np.median(shares))


def test_a_better_ranker_is_preferred_and_found() -> None:
    """Ranker B much better than A (the simulator's default noises, 0.4 against 1.0):
    the always-valid test flags B in every experiment of 1,000 users, and B wins most
    decided requests."""
    rate, share = run_experiments(World(5, noise_a=1.0, noise_b=0.4), 20, 1_000, looks=10)
    assert rate == 1.0 and share > 0.6


@pytest.mark.parametrize("seed", [7])
def test_an_aa_interleaving_is_flagged_in_at_most_5_percent_over_50_looks(seed: int) -> None:
    """Two rankers of equal quality (independent noise), users who differ in how much
    they click: the always-valid p-value read at 50 looks falls below 0.05 in at most
    5% of experiments."""
    world = World(seed, noise_a=0.2, noise_b=0.2, sigma=1.0)
    rate, share = run_experiments(world, 200, 1_500, looks=50)
    print(f"A/A: flagged in {rate:.1%} of 200 experiments; B's median share {share:.2f}")
    assert rate <= 0.05
    assert 0.45 < share < 0.55


def ab_found(world: World, per_arm: int) -> bool:
    """One A/B test of ``per_arm`` users per arm on nDCG@10, read once (fixed horizon):
    whether it finds ranker ``b`` better at 0.05."""
    user, arm, ndcg = world.ab(2 * per_arm)
    blocks = {}
    for side, name in ((0, "a"), (1, "b")):
        mine = arm == side
        block = np.zeros((1, BUCKETS, 6))
        np.add.at(block[0, :, 0], user[mine] % BUCKETS, 1.0)
        np.add.at(block[0, :, 2], user[mine] % BUCKETS, ndcg[mine])
        blocks[name] = block
    users = {name: int(np.unique(user[arm == side]).size) for side, name in ((0, "a"), (1, "b"))}
    readout = read_experiment(
        Experiment("x", control="a"), blocks, users, RULES, SequentialTracker()
    )
    (c,) = [c for c in readout.comparisons if c.adjusted == "false"]
    return c.ready and c.p_fixed < 0.05 and c.diff > 0


def interleaving_found(world: World, users: int) -> bool:
    """One interleaving experiment of ``users`` users, read once (fixed horizon)."""
    user, out = world.interleaved(users)
    found = read_pair(pair_block(user, out), SequentialTracker())
    return found.ready and found.p_fixed < 0.05 and found.preference > 0


def test_interleaving_reaches_the_ab_tests_power_with_a_tenth_of_its_users() -> None:
    """Ranker b better than a by a margin an A/B test on nDCG@10 detects with about 80%
    power at 20,000 users per arm (40,000 users); interleaving detects it with at least
    80% power at 4,000 users: a tenth of the A/B test's users. Same ground truth (users
    whose click propensity is lognormal, σ = 1.5), each experiment read once at 0.05.
    Per arm the gain is smaller (about 8x here) and it depends on how much users differ:
    BENCHMARKS.md has the curve."""
    ab_world = World(21, noise_a=0.9, noise_b=0.75, sigma=1.5)
    il_world = World(21, noise_a=0.9, noise_b=0.75, sigma=1.5)
    ab_power = np.mean([ab_found(ab_world, 20_000) for _ in range(50)])
    il_power = np.mean([interleaving_found(il_world, 4_000) for _ in range(100)])
    print(
        f"power: A/B at 20,000 users per arm {ab_power:.0%}; interleaving at 4,000 {il_power:.0%}"
    )
    assert 0.6 <= ab_power <= 0.97  # the margin is the one the issue names
    assert il_power >= 0.8


def test_only_the_first_64_positions_are_credited() -> None:
    """A long interleaved list keeps (and credits) its first DRAFT_POSITIONS teams: a
    credit at position 64 (1-based) counts, one at position 65 does not."""
    teams = ["A", "B"] * 50
    label = draft(teams, {"A": "x", "B": "y"})
    assert label == pair_key("x", "y") + "\x1e" + "01" * (DRAFT_POSITIONS // 2)
    found = credit([label, label], np.array([0, 1]), np.array([63, 64]), np.ones(2))
    assert found.outcome.tolist() == [1, NONE]  # position 64 is y's (B); 65 is past the cap


@pytest.mark.parametrize(
    ("teams", "rankers", "wrong"),
    [
        (["A", "B"], None, "come together"),
        (None, {"A": "x", "B": "y"}, "come together"),
        (["A", "B"], {"A": "x", "B": "x"}, "two different"),
        (["A", "B"], {"A": "x"}, "two different"),
        (["A"], {"A": "x", "B": "y"}, "1 values for 2 items"),
        (["A", "C"], {"A": "x", "B": "y"}, "does not name"),
        (["A", "B"], {"A": "x", "B": "y\x1e"}, "reserved"),
    ],
)
def test_an_impression_with_inconsistent_teams_is_invalid(teams, rankers, wrong) -> None:
    event = Impression("e", "r", "u", "il", 1, ["i1", "i2"], teams=teams, interleaving=rankers)
    found = check_impression(event, 100)
    assert found is not None and found[0] is InvalidReason.INVALID_FIELD and wrong in found[1]
    fine = Impression(
        "e", "r", "u", "il", 1, ["i1", "i2"], teams=["B", "B"], interleaving={"A": "x", "B": "y"}
    )
    assert check_impression(fine, 100) is None
