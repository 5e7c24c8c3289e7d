"""Process counters of one instance's pipeline as Prometheus metrics (sum across instances)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from evaluator.core.events import InvalidReason
from evaluator.engine.batches import PipelineStats


class PipelineCollector(Collector):
    """Process counters of this instance's pipeline."""

    def __init__(
        self,
        stats: PipelineStats,
        lag: Callable[[], dict[str, int]] = dict,
        watermark: Callable[[], int | None] = lambda: None,
        clock_ms: Callable[[], int] = lambda: 0,
    ) -> None:
        self.stats = stats
        self.lag = lag
        self.watermark = watermark
        self.clock_ms = clock_ms

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        consumed = CounterMetricFamily(
            "recsys_eval_events_consumed", "Messages consumed.", labels=["topic"]
        )
        for kind, n in sorted(s.consumed.items()):
            consumed.add_metric([kind], n)
        invalid = CounterMetricFamily(
            "recsys_eval_invalid_events", "Invalid events by reason.", labels=["reason"]
        )
        # every reason from the start, at 0: an alert's increase() sees the first ones
        reasons = {r.value: 0 for r in InvalidReason} | dict(s.invalid)
        for reason, n in sorted(reasons.items()):
            invalid.add_metric([reason], n)
        unmatched = CounterMetricFamily(
            "recsys_eval_unmatched_interactions",
            "Interactions a finalised request did not attribute.",
            labels=["reason"],
        )
        for reason, n in sorted(s.outcomes.items()):
            if reason != "attributed":
                unmatched.add_metric([str(reason)], n)
        yield consumed
        yield invalid
        yield unmatched
        counters: tuple[tuple[str, str, int], ...] = (
            (
                "recsys_eval_dead_lettered",
                "Messages copied to a dead-letter topic.",
                s.dead_lettered,
            ),
            (
                "recsys_eval_repartitioned_events",
                "Events forwarded to their user's partition (producers not keying by user).",
                s.repartitioned,
            ),
            ("recsys_eval_late_events", "Interactions for requests already finalised.", s.late),
            ("recsys_eval_duplicate_events", "Repeated events ignored.", s.duplicates),
            ("recsys_eval_finalised_requests", "Requests finalised by this instance.", s.finalised),
            (
                "recsys_eval_redis_errors",
                "Failed state-store operations (retried).",
                s.store_errors,
            ),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(name, text, value=value)
        latency = HistogramMetricFamily(
            "recsys_eval_batch_processing_seconds",
            "Time to decode, store and finalise one polled batch.",
            buckets=s.latency.cumulative(),
            sum_value=s.latency.total,
        )
        yield latency
        lag = GaugeMetricFamily(
            "recsys_eval_consumer_lag_messages",
            "Messages behind the partition end.",
            labels=["partition"],
        )
        for partition, n in sorted(self.lag().items()):
            lag.add_metric([partition], n)
        yield lag
        watermark = self.watermark()
        if watermark is not None:
            yield GaugeMetricFamily(
                "recsys_eval_watermark_delay_seconds",
                "Wall clock minus event-time watermark.",
                value=max(0.0, (self.clock_ms() - watermark) / 1000.0),
            )
