"""The simulator's click model, in two steps (pure): draw the random numbers, then
decide the outcomes for given click probabilities.

Position k is examined with probability ``theta_k`` and an examined item is clicked
with probability ``gamma``; add-to-cart and purchase are conditional on a click (video:
a click is a watch whose share of the duration grows with ``gamma``). Drawing first lets
the simulator draw a chunk's outcomes, in the order it always has, before it knows the
requests' times and so their seasonal click probabilities (:mod:`evaluator.core.seasons`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from evaluator.core.ab.interleaving import outcomes
from evaluator.core.metrics.ndcg import ndcg
from evaluator.core.metrics.spec import GainKind

FloatArray = npt.NDArray[np.float64]

MC_REPLICATES = 16
"""Click-model replicates per request behind the expected nDCG."""

Draws = tuple[FloatArray, FloatArray, FloatArray, FloatArray | None]
"""Random numbers behind one outcome per shown item: examination and click uniforms,
then the cart and purchase uniforms (video: the watch share's normal, None)."""


@dataclass(frozen=True, slots=True)
class ClickModel:
    """Outcomes of shown items, and their Monte Carlo expectations."""

    mode: Literal["ecommerce", "video"]
    cart_rate: float
    purchase_rate: float
    ks: tuple[int, ...]
    gain: GainKind

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> Draws:
        """The random numbers behind the outcomes of items of this shape."""
        examine, click = rng.random(shape), rng.random(shape)
        if self.mode == "video":
            return examine, click, rng.standard_normal(shape), None
        return examine, click, rng.random(shape), rng.random(shape)

    def decide(
        self, draws: Draws, gamma: FloatArray, theta: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """Outcomes from draws: (grade, watch share); ``gamma`` broadcasts to the draws."""
        examine, click, third, fourth = draws
        clicked = (examine < theta) & (click < gamma)
        if fourth is None:
            share = np.clip(gamma + 0.15 * third, 0.02, 1.0)
            return np.where(clicked, share, 0.0), share
        cart = clicked & (third < self.cart_rate)
        bought = cart & (fourth < self.purchase_rate)
        grade = clicked.astype(np.float64) + cart + bought
        return grade, np.zeros(clicked.shape)

    def expected_ndcg(self, draws: Draws, gamma: FloatArray, theta: FloatArray) -> FloatArray:
        """Monte Carlo E[nDCG@K] per request (``draws``: ``MC_REPLICATES`` of the requests)."""
        grade, _ = self.decide(draws, gamma, theta)
        values = ndcg(grade.reshape(-1, gamma.shape[1]), self.ks, self.gain)
        mean: FloatArray = values.reshape(MC_REPLICATES, gamma.shape[0], -1).mean(axis=0)
        return mean

    def expected_preference(
        self, draws: Draws, gamma: FloatArray, theta: FloatArray, teams: npt.NDArray[np.int8]
    ) -> FloatArray:
        """Monte Carlo: the expected outcome sum (team B's wins minus A's) and expected
        informative requests over the requests (``draws``: ``MC_REPLICATES`` of them)."""
        grade, _ = self.decide(draws, gamma, theta)
        flat = grade.reshape(-1, gamma.shape[1])
        row, position = np.nonzero(flat > 0)
        found = outcomes(np.tile(teams, (MC_REPLICATES, 1)), row, position, flat[row, position])
        informative = found != -2
        return np.array([found[informative].sum(), informative.sum()]) / MC_REPLICATES
