"""Settings as the plain values each layer takes: the one place that reads
``Settings`` on behalf of the core, the engine and the read side."""

from __future__ import annotations

from evaluator.config.settings import Settings
from evaluator.core.timeutil import format_duration_ms, parse_duration_ms
from evaluator.core.windows import AggregateLayout
from evaluator.engine.plan import EngineConfig, Estimating, TasksConfig
from evaluator.readout.config import ABRules, ReadoutConfig


def engine_config(
    settings: Settings, partitions: int | None = None, layout: AggregateLayout | None = None
) -> EngineConfig:
    """The partition engine's values (``layout``: the store's, default a fresh one)."""
    return EngineConfig(
        settings.finalise_config(partitions=partitions, layout=layout),
        max_out_of_orderness_ms=settings.event_time.ms("max_out_of_orderness"),
        idle_timeout_ms=settings.event_time.ms("idle_timeout"),
        history_cap=settings.cold_start.min_relevant_history,
        attribute=settings.metrics.diversity_attribute,
        shadow_of=settings.ab.control,
        finalised_ttl_ms=settings.engine.ttl_s("finalised_ttl") * 1000,
        experiments=settings.ab.experiment_list(),
        cuped_lookback_days=cuped_lookback_days(settings),
        inputs=("impressions", "interactions")
        if settings.kafka.partitioner == "trust"
        else ("impressions", "interactions", "repartition"),
    )


def cuped_lookback_days(settings: Settings) -> int:
    """Days of activity the engine keeps for CUPED: none unless an experiment can have
    users active before their exposure (one with a ``start`` or over some of the
    variants; in the ``default`` experiment a user's first impression is their
    exposure, so no one would have a covariate)."""
    experiments = settings.ab.experiment_list()
    if not any(e.start_ms is not None or e.variants for e in experiments):
        return 0
    return settings.ab.cuped_lookback_days()


def estimating(settings: Settings) -> Estimating | None:
    """How bucket curves are fitted, for ``propensity.model = "estimated"``."""
    p = settings.propensity
    if not p.estimated:
        return None
    return Estimating(p.estimator_name, p.positions, p.min_clicks)


def tasks_config(settings: Settings, partitions: int) -> TasksConfig:
    """A process's partitions (of ``partitions`` in all)."""
    return TasksConfig(
        engine_config(settings, partitions),
        partitions,
        settings.relevance.active(),
        partitioner=settings.kafka.partitioner,
        checkpoint_interval_ms=settings.engine.ms("checkpoint_interval"),
        max_list_length=settings.events.max_list_length,
        max_future_ms=settings.event_time.ms("max_future"),
        estimating=estimating(settings),
    )


def _window_labels(settings: Settings) -> dict[int, str]:
    return {
        parse_duration_ms(size): size.strip() if isinstance(size, str) else format_duration_ms(size)
        for size in settings.windows.sizes
    }


def _described(settings: Settings) -> dict[str, object]:
    """What produced the numbers, as replay's report states it."""
    p = settings.propensity
    return {
        "k": list(settings.metrics.k),
        "gain": settings.metrics.gain,
        "relevance": settings.relevance.profile,
        "propensity": f"estimated:{p.estimator_name}" if p.estimated else p.build().name,
        "zero_relevance": settings.metrics.zero_relevance,
        "attribution_window_ms": settings.join.rules().attribution_window_ms,
    }


def readout_config(settings: Settings) -> ReadoutConfig:
    """The read side's values (the collector, the dashboard, replay's report)."""
    ab, metrics, p = settings.ab, settings.metrics, settings.propensity
    return ReadoutConfig(
        settings.layout(),
        zero_relevance=metrics.zero_relevance,
        composite=dict(metrics.composite),
        catalog_size=metrics.catalog_size,
        diversity_attribute=metrics.diversity_attribute,
        variants=tuple(ab.variants),
        max_variants=ab.max_variants,
        control=ab.control,
        window_labels=_window_labels(settings),
        experiments=ab.experiment_list(),
        ab=ABRules(
            ab.alpha,
            ab.tuning,
            ab.min_users,
            ab.min_effective_buckets,
            cuped_lookback_days(settings),  # replay reads covariates as the engine keeps them
        ),
        propensity=(p.positions, p.min_clicks) if p.collect else None,
        described=_described(settings),
        regression=(
            settings.regression.rules(
                tuple(metrics.k), settings.provisional(), settings.maturity_ages_ms()
            )
            if settings.regression.enabled
            else None
        ),
    )
