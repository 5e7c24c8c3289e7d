"""Users an A/B test on nDCG@10 and team-draft interleaving need for 80% power (two-sided
0.05, one look), on the same simulated ground truth, as users differ more in how much
they click (the world of tests/test_interleaving.py: rankers a and b of ranking noise
0.9 and 0.75; a lognormal click propensity per user of spread ``sigma``).

Each figure comes from one large simulated sample: the A/B difference from both rankers
shown to the same users with the same clicks' random numbers (so it is exact to a few
percent), each arm's variance per user (user-clustered, the delta method), and the
interleaving preference and its variance per user from the engine's credit rule.
Users for 80% power = (1.96 + 0.84)^2 x variance / effect^2.

    .venv/bin/python bench/bench_interleaving.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_interleaving import EXAMINE, GAIN, ITEMS, SHOWN, World

Z = (1.96 + 0.84) ** 2


def per_user(user: np.ndarray, y: np.ndarray, users: int) -> tuple[float, float]:
    """The ratio-of-sums mean of ``y`` and its variance per user (delta method)."""
    s = np.bincount(user, y, users)
    c = np.bincount(user, minlength=users).astype(np.float64)
    mean = s.sum() / c.sum()
    return float(mean), float(((s - mean * c) / c.mean()).var())


def ndcg(clicked: np.ndarray) -> np.ndarray:
    dcg = clicked @ GAIN
    ideal = np.concatenate([[0.0], np.cumsum(GAIN)])[clicked.sum(axis=1)]
    return np.divide(dcg, ideal, out=np.zeros_like(dcg), where=ideal > 0)


def needed(sigma: float, seed: int, users: int, il_users: int) -> tuple[float, float, float]:
    """Users per arm (A/B), users (interleaving), and the A/B effect."""
    world = World(seed, 0.9, 0.75, sigma)
    user, segment, propensity = world.users(users)
    noise = world.rng.standard_normal((user.size, ITEMS))
    draw = world.rng.random((user.size, SHOWN))
    arms = []
    for level in world.noise:
        scores = world.latent[segment] + level * noise
        top = np.argpartition(-scores, SHOWN - 1, axis=1)[:, :SHOWN]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        shown = np.take_along_axis(top, order, axis=1)
        gamma = np.minimum(world.gamma[segment[:, None], shown] * propensity[:, None], 1.0)
        arms.append(per_user(user, ndcg(draw < gamma * EXAMINE), users))
    effect = arms[1][0] - arms[0][0]
    ab = Z * (arms[0][1] + arms[1][1]) / effect**2
    user, outcome = world.interleaved(il_users)
    informative = outcome != -2
    preference, variance = per_user(
        user[informative], outcome[informative].astype(np.float64), il_users
    )
    return ab, Z * variance / preference**2, effect


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=150_000)
    parser.add_argument("--il-users", type=int, default=40_000)
    parser.add_argument("--seed", type=int, default=21)
    args = parser.parse_args()
    print("| sigma | nDCG@10 effect | A/B users per arm | interleaving users | per arm | in all |")
    print("|---|---|---|---|---|---|")
    for sigma in (0.0, 1.0, 1.5, 2.0):
        ab, il, effect = needed(sigma, args.seed, args.users, args.il_users)
        print(
            f"| {sigma} | {effect:+.4f} | {ab:,.0f} | {il:,.0f} | {ab / il:.1f}x | "
            f"{2 * ab / il:.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
