"""Traffic simulator with a known ground truth (pure: numpy RNG in, events out).

Population: users in segments, items with a latent relevance per segment,
``gamma[s, i] = sigmoid(1.6 z - 2)`` with ``z ~ N(0, 1)``. Each variant ranks by
``z + noise * N(0, 1)``; a smaller noise ranks better. Clicks follow the
position-based model (:mod:`evaluator.core.sim_clicks`): position k is examined with
probability ``theta_k = k ** -eta`` and an examined item is clicked with probability
``gamma``; add-to-cart and purchase are conditional on a click (video: a watch).

With ``interleave`` every request shows the team-draft interleaving of the first two
variants' rankings instead (variant ``interleaved``, each position's team and the
two rankers named), and the ground truth holds the preference it converges to.

A slice of impressions can be randomised (top-n shuffle or a 1<->k swap) for
the propensity estimators. Traffic shape: users make several requests (Zipf
activity), and a configurable fraction of events arrive out of order, late
(after their event time by ``late_delay_ms``), duplicated or malformed.

Seasons (:mod:`evaluator.core.seasons`, off by default) give the request rate a daily
wave and a weekend dip and the click probabilities a daily wave; a regression cuts one
variant's click probabilities from a known instant on. A chunk's outcomes are drawn
before its times are known and decided after, so the default traffic is what it always
was, and a run with a regression emits the very events of the run without it for every
request before the regression's start.

The ground truth is exact for propensities and a Monte Carlo expectation over
the click model for nDCG@K, given the lists actually generated: ``raw`` is what
click-based nDCG converges to, ``debiased`` what it would be if every position
were examined.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt

from evaluator.core.ab.interleaving import team_drafts
from evaluator.core.sim_clicks import MC_REPLICATES, ClickModel
from evaluator.core.sim_config import T0_MS, SimulationConfig
from evaluator.core.sim_truth import GroundTruth, VariantTruth

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Teams = npt.NDArray[np.int8]
Kind = Literal["impressions", "interactions"]


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One message as it would be produced: topic kind, key (user id) and JSON payload."""

    kind: Kind
    key: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class _Batch:
    """A chunk of requests, drawn and decided, before their events are emitted."""

    users: IntArray
    lists: IntArray
    variant: IntArray
    teams: Teams | None
    randomised: npt.NDArray[np.bool_]
    swap_k: IntArray
    stamps: IntArray
    grade: FloatArray
    share: FloatArray
    raw: FloatArray
    debiased: FloatArray
    after: npt.NDArray[np.bool_]
    """Whether each request is at or after the injected regression's start."""


_ENCODE = msgspec.json.Encoder().encode
_MALFORMED = (
    b"{not json",
    b'{"event_id": "bad-1", "user_id": "u"}',
    b'{"event_id": "bad-2", "request_id": "r", "user_id": "u", "variant": "v",'
    b' "timestamp": 1, "items": []}',
)


class Simulator:
    """Generates traffic in arrival order, chunk by chunk, and accumulates the ground truth."""

    def __init__(self, config: SimulationConfig) -> None:
        self.config = c = config
        self.rng = np.random.default_rng(config.seed)
        z = self.rng.standard_normal((c.segments, c.items))
        self.latent = z
        self.gamma: FloatArray = 1.0 / (1.0 + np.exp(-(1.6 * z - 2.0)))
        self.segment: IntArray = self.rng.integers(0, c.segments, c.users)
        activity = 1.0 / np.arange(1, c.users + 1) ** 0.8
        self.activity: FloatArray = activity / activity.sum()
        self.variant_of_user: IntArray = self.rng.integers(0, len(c.variants), c.users)
        self.noise = np.array([n for _, n in c.variants])
        self.theta = c.theta()
        self.clicks = ClickModel(c.mode, c.cart_rate, c.purchase_rate, c.ks, c.gain)
        self.truth = GroundTruth(c)
        self.coin = random.Random(config.seed)
        for name in self.names():
            self.truth.variants[name] = VariantTruth.empty(len(c.ks))
        self.clock_ms = float(c.start_ms)
        self.generated = 0
        self._pending: list[tuple[int, int, SimEvent]] = []
        self._seq = 0

    def names(self) -> list[str]:
        """The variants impressions are labelled with."""
        return ["interleaved"] if self.config.interleave else [n for n, _ in self.config.variants]

    # -- ranking and outcomes ------------------------------------------------------------

    def _rank(self, users: IntArray) -> tuple[IntArray, IntArray, npt.NDArray[np.int8] | None]:
        """Top ``list_length`` items per request, each request's variant (an index of
        :meth:`names`) and, interleaving, each position's team (0: the first variant)."""
        if self.config.interleave:
            lists, teams = self._interleave(users)
            return lists, np.zeros(users.size, dtype=np.int64), teams
        variant = self.variant_of_user[users]
        return self._top(users, self.noise[variant]), variant, None

    def _top(self, users: IntArray, noise: FloatArray) -> IntArray:
        c = self.config
        scores = self.latent[self.segment[users]] + noise[:, None] * (
            self.rng.standard_normal((users.size, c.items))
        )
        top = np.argpartition(-scores, c.list_length - 1, axis=1)[:, : c.list_length]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        return np.take_along_axis(top, order, axis=1)

    def _interleave(self, users: IntArray) -> tuple[IntArray, npt.NDArray[np.int8]]:
        """The first two variants' rankings drafted into one list per request."""
        a, b = (self._top(users, np.full(users.size, n)) for n in self.noise[:2])
        return team_drafts(a, b, self.coin)

    def _randomise(self, lists: IntArray) -> tuple[npt.NDArray[np.bool_], IntArray]:
        """Shuffle the top n (or swap 1 and k) in a random slice; returns the slice and k."""
        c = self.config
        share = 0.0 if c.interleave else c.randomized_fraction  # teams stay by position
        chosen = np.less(self.rng.random(lists.shape[0]), share)
        k = np.zeros(lists.shape[0], dtype=np.int64)
        rows = np.flatnonzero(chosen)
        if c.randomization == "topn":
            lists[rows] = self.rng.permuted(lists[rows], axis=1)
            k[rows] = c.list_length
        else:
            k[rows] = self.rng.integers(2, c.list_length + 1, rows.size)
            first = lists[rows, 0].copy()
            lists[rows, 0] = lists[rows, k[rows] - 1]
            lists[rows, k[rows] - 1] = first
        return chosen, k

    def grades(self, gamma: FloatArray, theta: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Draw one outcome per shown item: (grade, watch share). Shapes follow ``gamma``."""
        return self.clicks.decide(self.clicks.draw(self.rng, gamma.shape), gamma, theta)

    # -- events --------------------------------------------------------------------------

    def _push(self, arrival_ms: float, event: SimEvent) -> None:
        c = self.config
        roll = self.rng.random()
        if roll < c.late_fraction:
            arrival_ms += c.late_delay_ms
        elif roll < c.late_fraction + c.out_of_order_fraction:
            arrival_ms += self.rng.uniform(0, c.out_of_order_ms)
        self._seq += 1
        heapq.heappush(self._pending, (int(arrival_ms), self._seq, event))
        if self.rng.random() < c.duplicate_fraction:
            self._seq += 1
            heapq.heappush(self._pending, (int(arrival_ms) + 500, self._seq, event))
            self.truth.count(f"duplicate_{event.kind}")
        if self.rng.random() < c.malformed_fraction:
            self._seq += 1
            bad = SimEvent(event.kind, b"", _MALFORMED[self._seq % len(_MALFORMED)])
            heapq.heappush(self._pending, (int(arrival_ms), self._seq, bad))
            self.truth.count(f"malformed_{event.kind}")

    def _interactions(
        self, request: tuple[str, str, int], items: list[str], grade: FloatArray, share: FloatArray
    ) -> None:
        c = self.config
        rid, user, ts = request
        key = user.encode()
        for pos in np.flatnonzero(grade > 0):
            t = ts + int(self.rng.integers(1_000, c.interaction_delay_ms))
            steps = ["watch"] if c.mode == "video" else ["click", "add_to_cart", "purchase"]
            for n, kind in enumerate(steps[: max(1, int(grade[pos]))]):
                event: dict[str, object] = {
                    "event_id": f"{rid}-{pos}-{n}",
                    "request_id": rid,
                    "user_id": user,
                    "item_id": items[pos],
                    "type": kind,
                    "timestamp": t,
                }
                if c.mode == "video":
                    event["watch_time"] = round(float(share[pos]) * c.video_duration_ms, 1)
                    event["duration"] = c.video_duration_ms
                self._push(t, SimEvent("interactions", key, _ENCODE(event)))
                self.truth.count("interactions")
                t += int(self.rng.integers(1_000, c.interaction_delay_ms))

    def _generate(self, n: int) -> int:
        """Generate ``n`` requests; returns the event time of the last impression."""
        c = self.config
        users = self.rng.choice(c.users, n, p=self.activity)
        lists, variant, teams = self._rank(users)
        randomised, swap_k = self._randomise(lists)
        base = self.gamma[self.segment[users][:, None], lists]
        replicated = (MC_REPLICATES, *base.shape)
        rng, clicks = self.rng, self.clicks
        draws = [clicks.draw(rng, shape) for shape in (base.shape, replicated, replicated)]
        if teams is not None:
            draws.append(clicks.draw(rng, replicated))
        gaps = self.rng.exponential(1000.0 / c.requests_per_second, n)
        stamps, self.clock_ms = c.seasons.arrivals(self.clock_ms, gaps)
        gamma = self._relevance(base, stamps, variant, teams)
        grade, share = clicks.decide(draws[0], gamma, self.theta)
        if teams is not None:
            self.truth.preference += clicks.expected_preference(draws[3], gamma, self.theta, teams)
        batch = _Batch(
            users,
            lists,
            variant,
            teams,
            randomised,
            swap_k,
            stamps,
            grade,
            share,
            clicks.expected_ndcg(draws[1], gamma, self.theta),
            clicks.expected_ndcg(draws[2], gamma, np.ones_like(self.theta)),
            np.zeros(n, dtype=np.bool_)
            if c.regression is None
            else stamps >= c.regression.start_ms(c.start_ms),
        )
        for j in range(n):
            self._emit(batch, j)
        self.generated += n
        return int(self.clock_ms)

    def _relevance(
        self, gamma: FloatArray, stamps: IntArray, variant: IntArray, teams: Teams | None
    ) -> FloatArray:
        """Click probabilities of the shown items at their request's time: the daily
        relevance wave and, for the regressed variant's items from its start, the drop."""
        c = self.config
        if c.seasons.steady_relevance and c.regression is None:
            return gamma
        factor = c.seasons.relevance_factor(stamps)[:, None] * np.ones(gamma.shape[1])
        if c.regression is not None:
            drop = c.regression.factor(stamps, c.start_ms)[:, None]
            index = [name for name, _ in c.variants].index(c.regression.variant)
            affected = teams == index if teams is not None else (variant == index)[:, None]
            factor = np.where(affected, factor * drop, factor)
        clipped: FloatArray = np.clip(gamma * factor, 0.0, 1.0)
        return clipped

    def _emit(self, b: _Batch, j: int) -> None:
        """Request ``j`` of a batch: its impression, its interactions and its truth."""
        c = self.config
        ts = int(b.stamps[j])
        rid = f"s{c.seed}-r{self.generated + j}"
        user, seg = f"u{b.users[j]}", int(self.segment[b.users[j]])
        items = [f"i{i}" for i in b.lists[j]]
        name = self.names()[b.variant[j]]
        self.truth.variants[name].add(b.raw[j], b.debiased[j], bool(b.after[j]))
        imp: dict[str, object] = {
            "event_id": f"imp-{rid}",
            "request_id": rid,
            "user_id": user,
            "variant": name,
            "experiment": c.experiment,
            "timestamp": ts,
            "items": items,
            "context": f"seg{seg}",
            "item_attributes": {"category": [f"cat{i % 12}" for i in b.lists[j]]},
        }
        if b.teams is not None:
            imp["teams"] = ["B" if t else "A" for t in b.teams[j].tolist()]
            imp["interleaving"] = {"A": c.variants[0][0], "B": c.variants[1][0]}
        if b.randomised[j]:
            imp["randomization"] = (
                {"type": "topn", "n": int(b.swap_k[j])}
                if c.randomization == "topn"
                else {"type": "swap", "k": int(b.swap_k[j])}
            )
        self._push(ts, SimEvent("impressions", user.encode(), _ENCODE(imp)))
        self.truth.count("impressions")
        self._interactions((rid, user, ts), items, b.grade[j], b.share[j])

    def _release(self, until_ms: float) -> list[SimEvent]:
        out: list[SimEvent] = []
        pending = self._pending
        while pending and pending[0][0] <= until_ms:
            out.append(heapq.heappop(pending)[2])
        return out

    def chunks(self, requests: int | None, chunk: int = 256) -> Iterator[list[SimEvent]]:
        """Events in arrival order, a chunk of requests at a time; ``None``: forever."""
        while requests is None or self.generated < requests:
            n = chunk if requests is None else min(chunk, requests - self.generated)
            released = self._release(self._generate(n))
            if released:
                yield released
        # what is still to arrive (interactions after the last impression), a second of
        # event time at a time: ``clock_ms`` stays the newest time released
        while self._pending:
            self.clock_ms = max(self.clock_ms, float(self._pending[0][0] + 999))
            yield self._release(self.clock_ms)


__all__ = ["T0_MS", "Kind", "SimEvent", "SimulationConfig", "Simulator"]
