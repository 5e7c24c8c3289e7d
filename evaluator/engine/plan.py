"""The live path's plain values: everything :class:`~evaluator.engine.tasks.Tasks`
needs, built from the settings by :mod:`evaluator.config.plain` (the engine never
reads ``Settings``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from evaluator.core.experiments import Experiment
from evaluator.core.finalise import FinaliseConfig
from evaluator.core.propensity.estimation import Estimator
from evaluator.core.propensity.models import EstimatedCurve, NoBias
from evaluator.core.relevance import RelevanceProfile
from evaluator.core.windows import AggregateLayout
from evaluator.engine.partitioner import Partitioner


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs, as plain values (milliseconds)."""

    finalise: FinaliseConfig
    max_out_of_orderness_ms: int = 5_000
    idle_timeout_ms: int = 30_000
    history_cap: int = 3
    attribute: str = "category"
    shadow_of: str = ""
    """The variant whose shadow ranking an open request keeps for RBO (the configured
    control; "": the first by name)."""
    finalised_ttl_ms: int = 6 * 3_600_000
    history_ttl_ms: int = 30 * 86_400_000
    inputs: tuple[str, ...] = ("impressions", "interactions")
    """The engine's input streams: each holds the watermark back until it delivers or
    goes idle. The first is the one the others wait for (an interaction can wait for
    its request): until it has delivered, nothing expires by data time."""
    experiments: tuple[Experiment, ...] = ()
    """Experiments whose exposures (a user's first impression) are recorded."""
    cuped_lookback_days: int = 0
    """Whole days of each user's activity kept for the CUPED covariate (0: none)."""
    eager: tuple[str, ...] = ("repartition",)
    """Inputs idle as soon as they are confirmed at their end: the repartition topic
    only carries events forwarded by other partitions, usually none."""

    @property
    def horizon_ms(self) -> int:
        """A request-less interaction this much older than the watermark joins nothing open."""
        rules = self.finalise.rules
        return (
            rules.attribution_window_ms
            + 2 * rules.max_clock_skew_ms
            + self.finalise.allowed_lateness_ms
        )


@dataclass(frozen=True, slots=True)
class Estimating:
    """``propensity.model = "estimated"``: how the curve of each window bucket is fitted."""

    estimator: Estimator
    positions: int
    min_clicks: int


@dataclass(frozen=True, slots=True)
class TasksConfig:
    """A process's partitions: the engine's values plus decoding and checkpointing."""

    engine: EngineConfig
    partitions: int
    relevance: RelevanceProfile
    partitioner: Partitioner = "murmur2"
    checkpoint_interval_ms: int = 1_000
    max_list_length: int = 1_000
    max_future_ms: int = 60_000
    estimating: Estimating | None = None

    def over(self, layout: AggregateLayout) -> TasksConfig:
        """The same values over ``layout`` (the store's, grown over stored state)."""
        finalise = dataclasses.replace(self.engine.finalise, layout=layout)
        return dataclasses.replace(self, engine=dataclasses.replace(self.engine, finalise=finalise))


def with_curve(config: FinaliseConfig, curve: tuple[float, ...] | None) -> FinaliseConfig:
    """``config`` scoring with an estimated propensity curve (none yet: no bias)."""
    model = EstimatedCurve(curve) if curve else NoBias()
    scoring = dataclasses.replace(config.scoring, propensity=model)
    return dataclasses.replace(config, scoring=scoring)
