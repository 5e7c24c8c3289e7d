"""How the read side reads: plain values built from the settings by
:mod:`evaluator.config.plain` (the read side never reads ``Settings``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evaluator.core.ab.readout import ReadoutRules
from evaluator.core.experiments import Experiment
from evaluator.core.metrics.registry import METRICS
from evaluator.core.regression import RegressionRules
from evaluator.core.rows import COVARIATE, INTERLEAVING, RowSchema, column_map
from evaluator.core.windows import AggregateLayout


@dataclass(frozen=True, slots=True)
class ABRules:
    """The A/B readout's thresholds (``ab.*``)."""

    alpha: float = 0.05
    tuning: float = 5000.0
    min_users: int = 1000
    min_effective_buckets: float = 16.0
    cuped_lookback_days: int = 14
    """CUPED's pre-exposure days (``ab.cuped_lookback``; 0: no CUPED readout)."""


@dataclass(frozen=True, slots=True)
class ReadoutConfig:
    """Everything the collector, the dashboard and replay's report read with."""

    layout: AggregateLayout
    """A fresh layout (replay's rows); live readers use the store's."""
    zero_relevance: str = "count"
    composite: Mapping[str, float] = field(default_factory=dict)
    catalog_size: int = 0
    """Items in the catalog; 0: the distinct items seen."""
    diversity_attribute: str = "category"
    variants: tuple[str, ...] = ()
    """The variant allow-list (empty: the busiest ``max_variants``)."""
    max_variants: int = 20
    control: str = ""
    window_labels: Mapping[int, str] = field(default_factory=dict)
    """Window size (ms) -> its label, as configured (``5m``)."""
    experiments: tuple[Experiment, ...] = ()
    ab: ABRules = field(default_factory=ABRules)
    propensity: tuple[int, int] | None = None
    """(positions, min_clicks) when propensities are estimated and exported."""
    described: Mapping[str, Any] = field(default_factory=dict)
    """The report's ``settings`` block (what produced the numbers)."""
    regression: RegressionRules | None = None
    """The regression detector's rules (None: disabled)."""

    @property
    def ks(self) -> tuple[int, ...]:
        return self.layout.ks

    def rules(self, layout: AggregateLayout | None = None) -> ReadoutRules:
        """How experiments are read, over ``layout``'s columns (default: the fresh one)."""
        layout = layout or self.layout
        policy = self.zero_relevance
        columns = column_map(layout.schema, layout.ks, METRICS)
        ab = self.ab
        return ReadoutRules(
            layout.ks,
            columns,
            policy,
            ab.alpha,
            ab.tuning,
            ab.min_users,
            ab.min_effective_buckets,
            {mk: layout.schema.denominator(*mk, policy) for mk in columns},
            _covariate(layout.schema) if ab.cuped_lookback_days else None,
            _interleaving(layout.schema),
        )


def _covariate(schema: RowSchema) -> tuple[int, int] | None:
    """The CUPED covariate's columns, when the layout has them."""
    names = set(schema.names)
    if not all(name in names for name in COVARIATE):
        return None
    x, users = COVARIATE
    return schema.index(x), schema.index(users)


def _interleaving(schema: RowSchema) -> tuple[int, int, int] | None:
    """A ranker pair's columns, when the layout has them."""
    if not all(name in schema.names for name in INTERLEAVING):
        return None
    total, requests, wins = (schema.index(name) for name in INTERLEAVING)
    return total, requests, wins
