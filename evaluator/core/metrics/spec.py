"""What a per-request metric is: its computation and how every consumer shows it.

Each metric module defines its :class:`MetricSpec`; :mod:`evaluator.core.metrics.registry`
lists them, and scoring, the stored statistics rows, the Prometheus gauges,
replay's report and the dashboard all read that list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
GainKind = Literal["exponential", "linear"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Ranked:
    """A batch of requests to score: grades (rows: requests, columns: positions, 0 past a
    list's end), the cutoffs, the gain, and the inverse-propensity weight of each
    position (None: no position-bias model)."""

    grades: FloatArray
    ks: tuple[int, ...]
    gain: GainKind = "exponential"
    weights: FloatArray | None = None
    _memo: dict[str, Any] = field(default_factory=dict)

    def shared(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, once per batch: metrics built on the same intermediate result
        (the cutoff counts, the unweighted nDCG) share it."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One per-request metric, computed at every cutoff K and averaged over a window's
    requests under the zero-relevance policy."""

    name: str
    """Key in replay's report and stem of its stored columns (``sum:<name>@<k>``)."""
    compute: Callable[[Ranked], FloatArray]
    """Per-request values, shape ``(rows, len(ks))``; 0 for a request without a relevant
    item."""
    label: str
    """Heading in the readable table and the dashboard."""
    family: str | None
    """Prometheus gauge its window means are exported as (None: replay's report only)."""
    help: str
    labels: tuple[tuple[str, str], ...] = ()
    """Constant labels that tell metrics sharing a family apart."""
    table: bool = True
    """Shown in replay's readable table (the JSON report has every metric)."""
