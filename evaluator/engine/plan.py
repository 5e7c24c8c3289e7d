"""The live path's plain values: everything :class:`~evaluator.engine.tasks.Tasks`
needs, built from the settings by :mod:`evaluator.config.plain` (the engine never
reads ``Settings``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from evaluator.core.finalise import FinaliseConfig
from evaluator.core.propensity.estimation import Estimator
from evaluator.core.propensity.models import EstimatedCurve, NoBias
from evaluator.core.relevance import RelevanceProfile
from evaluator.core.windows import AggregateLayout
from evaluator.engine.partition import EngineConfig
from evaluator.engine.partitioner import Partitioner


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
