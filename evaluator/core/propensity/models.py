"""Position-bias models and inverse-propensity (IPS) weights.

A propensity model gives theta_k, the probability that a user examines position
k, relative to position 1 (theta_1 = 1). The IPS weight of position k is
``1 / max(theta_k, clip)``; clipping bounds the variance that tiny propensities
would otherwise add. Multiplying each shown item's gain by its position's weight
is the "adjusted relevance = relevance x position discount" of the design seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


class PropensityModel(Protocol):
    """Examination propensity per position, normalised so that theta_1 = 1."""

    @property
    def name(self) -> str:
        """Short label, e.g. ``power``."""
        ...

    def theta(self, width: int) -> FloatArray:
        """theta_1 .. theta_width."""
        ...


@dataclass(frozen=True, slots=True)
class NoBias:
    """Every position is examined equally: weights are all 1."""

    name: str = "none"

    def theta(self, width: int) -> FloatArray:
        return np.ones(width)


@dataclass(frozen=True, slots=True)
class PowerLaw:
    """theta_k = k ** -eta, the usual fit to eye-tracking and intervention data."""

    eta: float
    name: str = "power"

    def __post_init__(self) -> None:
        if not np.isfinite(self.eta) or self.eta < 0:
            raise ValueError(f"power-law eta must be a finite number >= 0, got {self.eta}")

    def theta(self, width: int) -> FloatArray:
        return np.arange(1, width + 1, dtype=np.float64) ** -self.eta


@dataclass(frozen=True, slots=True)
class PositionTable:
    """Explicit propensities per position, normalised by the first.

    Positions past the end of the table reuse its last value.
    """

    values: tuple[float, ...]
    name: str = "table"

    def __post_init__(self) -> None:
        if not self.values or any(not (v > 0 and np.isfinite(v)) for v in self.values):
            raise ValueError("a propensity table needs positive finite values")

    def theta(self, width: int) -> FloatArray:
        table = np.asarray(self.values, dtype=np.float64) / self.values[0]
        if width <= table.size:
            return table[:width]
        return np.concatenate([table, np.full(width - table.size, table[-1])])


@dataclass(frozen=True, slots=True)
class EstimatedCurve:
    """An estimated curve for positions 1..P, extended past P by the power law fitted to
    it (least squares of log θ_k on log k through θ_1 = 1) from θ_P on: a list longer
    than the estimated positions keeps being discounted instead of every later position
    taking θ_P (which under-weights them)."""

    values: tuple[float, ...]
    name: str = "estimated"

    def __post_init__(self) -> None:
        PositionTable(self.values)  # the same checks

    def theta(self, width: int) -> FloatArray:
        table = np.asarray(self.values, dtype=np.float64) / self.values[0]
        if width <= table.size:
            return table[:width]
        x = np.log(np.arange(2, table.size + 1, dtype=np.float64))
        eta = max(0.0, float(-(x @ np.log(table[1:])) / (x @ x))) if x.size else 0.0
        k = np.arange(table.size + 1, width + 1, dtype=np.float64)
        return np.concatenate([table, table[-1] * (k / table.size) ** -eta])


def ips_weights(model: PropensityModel, width: int, clip: float = 0.05) -> FloatArray:
    """w_k = 1 / max(theta_k, clip) for positions 1..width."""
    if not 0 < clip <= 1:
        raise ValueError(f"propensity clip must be in (0, 1], got {clip}")
    return 1.0 / np.maximum(model.theta(width), clip)


def parse_propensity(spec: str | Sequence[float]) -> PropensityModel:
    """Build a model from configuration: ``"none"``, ``"power(1.0)"``, ``"power:1.0"``,
    ``"table:1,0.6,0.4"`` or a list of numbers."""
    if not isinstance(spec, str):
        return PositionTable(tuple(float(v) for v in spec))
    text = spec.strip().lower()
    if text in ("", "none"):
        return NoBias()
    for prefix in ("power(", "power:", "power="):
        if text.startswith(prefix):
            body = text[len(prefix) :].rstrip(")")
            return PowerLaw(float(body))
    if text.startswith("table:"):
        return PositionTable(tuple(float(v) for v in text[6:].split(",")))
    raise ValueError(
        f"unknown propensity {spec!r}: use none, power(ETA), table:T1,T2,... or estimated"
    )
