"""The simulator's settings: everything that shapes simulated traffic (a module of its
own, so that the simulator and its ground truth both read it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from evaluator.core.metrics.spec import GainKind
from evaluator.core.seasons import Regression, Seasons

FloatArray = npt.NDArray[np.float64]
T0_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: the default start of simulated event time (files stay reproducible)."""


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
    seasons: Seasons = field(default_factory=Seasons)
    """Daily and weekly cycles of the request rate and of relevance (off by default)."""
    regression: Regression | None = None
    """A drop of one variant's relevance from a given event time on (None: none)."""

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
            "regression": self.regression is None
            or self.regression.variant
            in [n for n, _ in self.variants][: 2 if self.interleave else None],
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
