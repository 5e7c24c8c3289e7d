"""Traffic simulator with a known ground truth (pure: numpy RNG in, events out).

Population: users in segments, items with a latent relevance per segment,
``gamma[s, i] = sigmoid(1.6 z - 2)`` with ``z ~ N(0, 1)``. Each variant ranks by
``z + noise * N(0, 1)``; a smaller noise ranks better. Clicks follow the
position-based model: position k is examined with probability
``theta_k = k ** -eta`` and an examined item is clicked with probability
``gamma``. Add-to-cart and purchase are conditional on a click; in video mode
a click becomes a watch whose share of the duration grows with ``gamma``.

With ``interleave`` every request shows the team-draft interleaving of the first two
variants' rankings instead (variant ``interleaved``, each position's team and the
two rankers named), and the ground truth holds the preference it converges to.

A slice of impressions can be randomised (top-n shuffle or a 1<->k swap) for
the propensity estimators. Traffic shape: users make several requests (Zipf
activity), and a configurable fraction of events arrive out of order, late
(after their event time by ``late_delay_ms``), duplicated or malformed.

The ground truth is exact for propensities and a Monte Carlo expectation over
the click model for nDCG@K, given the lists actually generated: ``raw`` is what
click-based nDCG converges to, ``debiased`` what it would be if every position
were examined.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt

from evaluator.core.ab.interleaving import outcomes, team_drafts
from evaluator.core.metrics.ndcg import ndcg
from evaluator.core.metrics.spec import GainKind

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Kind = Literal["impressions", "interactions"]

T0_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: the default start of simulated event time (files stay reproducible)."""

MC_REPLICATES = 16
"""Click-model replicates per request behind the expected nDCG."""


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """Everything that shapes simulated traffic; equal configs give equal events."""

    seed: int = 0
    users: int = 2000
    items: int = 400
    segments: int = 8
    variants: tuple[tuple[str, float], ...] = (("control", 1.0), ("treatment", 0.4))
    """``(name, ranking noise)``: the noise added to the latent relevance before ranking."""
    list_length: int = 10
    eta: float = 1.0
    """Examination propensity of position k is ``k ** -eta``."""
    requests_per_second: float = 100.0
    """Density of impressions in event time."""
    start_ms: int = T0_MS
    mode: Literal["ecommerce", "video"] = "ecommerce"
    cart_rate: float = 0.3
    purchase_rate: float = 0.4
    video_duration_ms: int = 60_000
    randomized_fraction: float = 0.1
    randomization: Literal["topn", "swap"] = "topn"
    interaction_delay_ms: int = 60_000
    """Each interaction follows the previous step (impression, click, cart) by 1 s to this."""
    out_of_order_fraction: float = 0.05
    out_of_order_ms: int = 3_000
    late_fraction: float = 0.0
    late_delay_ms: int = 300_000
    duplicate_fraction: float = 0.01
    malformed_fraction: float = 0.005
    experiment: str = "sim"
    ks: tuple[int, ...] = (10,)
    gain: GainKind = "exponential"
    interleave: bool = False
    """Show every request the team-draft interleaving of the first two variants."""

    def __post_init__(self) -> None:
        checks = {
            "users": self.users >= 1,
            "items": self.items >= self.list_length,
            "segments": self.segments >= 1,
            "variants": len(self.variants) >= (2 if self.interleave else 1)
            and all(n >= 0 for _, n in self.variants),
            "list_length": self.list_length >= 2,
            "eta": 0 <= self.eta <= 5,
            "requests_per_second": self.requests_per_second > 0,
            "interaction_delay_ms": self.interaction_delay_ms > 1_000,
        }
        for name in ("randomized_fraction", "out_of_order_fraction", "late_fraction"):
            checks[name] = 0 <= getattr(self, name) <= 1
        for name in ("duplicate_fraction", "malformed_fraction", "cart_rate", "purchase_rate"):
            checks[name] = 0 <= getattr(self, name) <= 1
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid simulation setting(s): {', '.join(bad)}")

    def theta(self) -> FloatArray:
        return np.arange(1, self.list_length + 1, dtype=np.float64) ** -self.eta


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One message as it would be produced: topic kind, key (user id) and JSON payload."""

    kind: Kind
    key: bytes
    payload: bytes


@dataclass(slots=True)
class VariantTruth:
    requests: int = 0
    raw_sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    debiased_sum: FloatArray = field(default_factory=lambda: np.zeros(0))


@dataclass(slots=True)
class GroundTruth:
    """What the evaluator should report for the traffic generated so far."""

    config: SimulationConfig
    variants: dict[str, VariantTruth] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    preference: FloatArray = field(default_factory=lambda: np.zeros(2))
    """Interleaving: the expected outcome sum and the expected informative requests."""

    def count(self, name: str, n: int = 1) -> None:
        self.events[name] = self.events.get(name, 0) + n

    def as_dict(self) -> dict[str, object]:
        c = self.config
        ndcg_truth: dict[str, dict[str, dict[str, float]]] = {}
        for name, v in self.variants.items():
            n = max(v.requests, 1)
            ndcg_truth[name] = {
                f"@{k}": {"raw": v.raw_sum[j] / n, "debiased": v.debiased_sum[j] / n}
                for j, k in enumerate(c.ks)
            }
        return {
            "seed": c.seed,
            "eta": c.eta,
            "propensity": [round(float(t), 6) for t in c.theta()],
            "gain": c.gain,
            "ndcg": ndcg_truth,
            "requests": {name: v.requests for name, v in self.variants.items()},
            "events": dict(self.events),
            **({"interleaving": self.interleaving()} if c.interleave else {}),
        }

    def interleaving(self) -> dict[str, object]:
        """The two rankers (sorted) and the preference for the second, as the evaluator
        estimates it: expected outcome sum over expected informative requests."""
        first, second = sorted(name for name, _ in self.config.variants[:2])
        total, informative = self.preference.tolist()
        sign = 1.0 if first == self.config.variants[0][0] else -1.0  # team A is variant 0
        value = sign * total / informative if informative else float("nan")
        return {"rankers": [first, second], "preference": value}


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
        self.truth = GroundTruth(c)
        self.coin = random.Random(config.seed)
        for name in self.names():
            self.truth.variants[name] = VariantTruth(0, np.zeros(len(c.ks)), np.zeros(len(c.ks)))
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

    def _expected_preference(self, gamma: FloatArray, teams: npt.NDArray[np.int8]) -> FloatArray:
        """Monte Carlo: the expected outcome sum (team B's wins minus A's) and expected
        informative requests over the requests."""
        reps = np.ascontiguousarray(np.broadcast_to(gamma, (MC_REPLICATES, *gamma.shape)))
        grade, _ = self.grades(reps, self.theta)
        flat = grade.reshape(-1, gamma.shape[1])
        row, position = np.nonzero(flat > 0)
        found = outcomes(np.tile(teams, (MC_REPLICATES, 1)), row, position, flat[row, position])
        informative = found != -2
        return np.array([found[informative].sum(), informative.sum()]) / MC_REPLICATES

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
        c = self.config
        clicked = (self.rng.random(gamma.shape) < theta) & (self.rng.random(gamma.shape) < gamma)
        if c.mode == "video":
            share = np.clip(gamma + 0.15 * self.rng.standard_normal(gamma.shape), 0.02, 1.0)
            return np.where(clicked, share, 0.0), share
        cart = clicked & (self.rng.random(gamma.shape) < c.cart_rate)
        bought = cart & (self.rng.random(gamma.shape) < c.purchase_rate)
        grade = clicked.astype(np.float64) + cart + bought
        return grade, np.zeros_like(gamma)

    def _expected_ndcg(self, gamma: FloatArray, theta: FloatArray) -> FloatArray:
        """Monte Carlo E[nDCG@K] per request under the click model."""
        reps = np.broadcast_to(gamma, (MC_REPLICATES, *gamma.shape))
        grade, _ = self.grades(np.ascontiguousarray(reps), theta)
        values = ndcg(grade.reshape(-1, gamma.shape[1]), self.config.ks, self.config.gain)
        mean: FloatArray = values.reshape(MC_REPLICATES, gamma.shape[0], -1).mean(axis=0)
        return mean

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
        gamma = self.gamma[self.segment[users][:, None], lists]
        grade, share = self.grades(gamma, self.theta)
        raw = self._expected_ndcg(gamma, self.theta)
        debiased = self._expected_ndcg(gamma, np.ones_like(self.theta))
        if teams is not None:
            self.truth.preference += self._expected_preference(gamma, teams)
        gaps = self.rng.exponential(1000.0 / c.requests_per_second, n)
        names = self.names()
        rankers = {"A": c.variants[0][0], "B": c.variants[1][0]} if teams is not None else {}
        for j in range(n):
            self.clock_ms += gaps[j]
            ts = int(self.clock_ms)
            rid = f"s{c.seed}-r{self.generated + j}"
            user, seg = f"u{users[j]}", int(self.segment[users[j]])
            items = [f"i{i}" for i in lists[j]]
            name = names[variant[j]]
            truth = self.truth.variants[name]
            truth.requests += 1
            truth.raw_sum += raw[j]
            truth.debiased_sum += debiased[j]
            imp: dict[str, object] = {
                "event_id": f"imp-{rid}",
                "request_id": rid,
                "user_id": user,
                "variant": name,
                "experiment": c.experiment,
                "timestamp": ts,
                "items": items,
                "context": f"seg{seg}",
                "item_attributes": {"category": [f"cat{i % 12}" for i in lists[j]]},
            }
            if teams is not None:
                imp["teams"] = ["B" if t else "A" for t in teams[j].tolist()]
                imp["interleaving"] = rankers
            if randomised[j]:
                imp["randomization"] = (
                    {"type": "topn", "n": int(swap_k[j])}
                    if c.randomization == "topn"
                    else {"type": "swap", "k": int(swap_k[j])}
                )
            self._push(ts, SimEvent("impressions", user.encode(), _ENCODE(imp)))
            self.truth.count("impressions")
            self._interactions((rid, user, ts), items, grade[j], share[j])
        self.generated += n
        return int(self.clock_ms)

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
