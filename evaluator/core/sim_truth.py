"""The simulator's ground truth: what the evaluator should report for the traffic
generated so far (expected nDCG per variant, event counts, the interleaving preference
and, with a regression injected, the expected nDCG before and after its start)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import numpy.typing as npt

from evaluator.core.sim_config import SimulationConfig

FloatArray = npt.NDArray[np.float64]


@dataclass(slots=True)
class VariantTruth:
    """Sums of the expected nDCG per cutoff over a variant's requests; ``after_*``: over
    the requests from an injected regression's start on."""

    requests: int = 0
    raw_sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    debiased_sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    after_requests: int = 0
    after_raw_sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    after_debiased_sum: FloatArray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def empty(cls, cutoffs: int) -> VariantTruth:
        sums = [np.zeros(cutoffs) for _ in range(4)]
        return cls(0, sums[0], sums[1], 0, sums[2], sums[3])

    def add(self, raw: FloatArray, debiased: FloatArray, after: bool) -> None:
        """One request's expected nDCG (raw and debiased) per cutoff."""
        self.requests += 1
        self.raw_sum += raw
        self.debiased_sum += debiased
        if after:
            self.after_requests += 1
            self.after_raw_sum += raw
            self.after_debiased_sum += debiased


def _means(
    ks: tuple[int, ...], raw: FloatArray, debiased: FloatArray, requests: int
) -> dict[str, dict[str, float]]:
    n = max(requests, 1)
    return {f"@{k}": {"raw": raw[j] / n, "debiased": debiased[j] / n} for j, k in enumerate(ks)}


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
        ndcg_truth = {
            name: _means(c.ks, v.raw_sum, v.debiased_sum, v.requests)
            for name, v in self.variants.items()
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
            **({"seasons": asdict(c.seasons)} if not c.seasons.steady else {}),
            **({"regression": self.regression()} if c.regression is not None else {}),
        }

    def interleaving(self) -> dict[str, object]:
        """The two rankers (sorted) and the preference for the second, as the evaluator
        estimates it: expected outcome sum over expected informative requests."""
        first, second = sorted(name for name, _ in self.config.variants[:2])
        total, informative = self.preference.tolist()
        sign = 1.0 if first == self.config.variants[0][0] else -1.0  # team A is variant 0
        value = sign * total / informative if informative else float("nan")
        return {"rankers": [first, second], "preference": value}

    def regression(self) -> dict[str, object]:
        """The injected regression and every variant's expected nDCG (and requests)
        before and from its start: the change a detector should find, and when."""
        c = self.config
        r = c.regression
        assert r is not None
        before = {
            name: _means(
                c.ks,
                v.raw_sum - v.after_raw_sum,
                v.debiased_sum - v.after_debiased_sum,
                v.requests - v.after_requests,
            )
            for name, v in self.variants.items()
        }
        after = {
            name: _means(c.ks, v.after_raw_sum, v.after_debiased_sum, v.after_requests)
            for name, v in self.variants.items()
        }
        counts = {
            "before": {name: v.requests - v.after_requests for name, v in self.variants.items()},
            "after": {name: v.after_requests for name, v in self.variants.items()},
        }
        return {
            "variant": r.variant,
            "drop": r.drop,
            "after_ms": r.after_ms,
            "start_ms": r.start_ms(c.start_ms),
            "requests": counts,
            "ndcg": {"before": before, "after": after},
        }
