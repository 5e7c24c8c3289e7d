"""Prometheus export: window metrics read from the state store (when collected), plus
process counters.

Window metrics come from the shared store, so every instance reports the same
global values and a restart loses nothing; aggregate across instances with
``max by (...)`` (or ``avg``), never ``sum``. Process counters are per instance;
aggregate them with ``sum``. Labels are bounded: variants are capped
(``ab.max_variants`` or the ``ab.variants`` allow-list, the rest folded into
``other``) and no user or item id ever becomes a label.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    Metric,
)
from prometheus_client.registry import Collector

from evaluator.adapters.prometheus.families import Families, new_families
from evaluator.core.ab.readout import ExperimentReadout, read_experiment
from evaluator.core.ab.stats import SequentialTracker
from evaluator.core.metrics.composite import composite_score
from evaluator.core.metrics.registry import REGISTRY
from evaluator.core.propensity.estimation import estimate_all
from evaluator.core.timeutil import format_duration_ms
from evaluator.engine.ports import FloatArray, StateStore
from evaluator.readout.config import ReadoutConfig
from evaluator.readout.windows import OTHER, cap_variants, window_totals

log = logging.getLogger(__name__)

COHORTS = {"all": None, "cold_start": 0, "established": 1}
EXPORTED = [(m, m.family) for m in REGISTRY if m.family is not None]
"""The registered metrics exported as gauges, with their family."""


class WindowCollector(Collector):
    """Reads window aggregates from the store when Prometheus scrapes."""

    def __init__(
        self,
        store: StateStore,
        config: ReadoutConfig,
        watermark: Callable[[], int | None],
        sketch_refresh_s: float = 60.0,
    ) -> None:
        self.store = store
        self.config = config
        self.layout = store.layout
        self.watermark = watermark
        self.tracker = SequentialTracker()
        self.sketch_refresh_s = sketch_refresh_s
        """Coverage and overlap come from sketches that are costly to merge: refreshed at
        most this often (they describe windows of 5 minutes and more)."""
        self._sketches: dict[tuple[int, str], tuple[float, Any]] = {}
        self.window_label = config.window_labels
        self.rules = config.rules(self.layout)
        self.experiments = config.experiments
        self._status: dict[tuple[str, str], str] = {}
        self._source: Callable[[], Families] | None = None

    def _scrape(self) -> Families:
        fam = new_families()
        frontier = self.watermark()
        if frontier is not None:
            fam.add("recsys_eval_watermark_seconds", {}, frontier / 1000.0)
            open_, due = self.store.open_requests(frontier)
            fam.add("recsys_eval_open_requests", {}, open_)
            fam.add("recsys_eval_due_requests", {}, due)
            for window in self.layout.windows_ms:
                self._window(fam, window, frontier)
            self._experiments(fam)
        if self.config.propensity is not None:
            self._propensity(fam, *self.config.propensity)
        return fam

    def _propensity(self, fam: Families, positions: int, min_clicks: int) -> None:
        estimates = self._cached(
            (0, "propensity"),  # cached like the sketches (EM's intervals take ten refits)
            lambda: estimate_all(self.store.propensity_counts(), positions, min_clicks),
            done=lambda found: any(math.isfinite(e.eta) for e in found.values()),
        )
        for name, e in estimates.items():
            fam.add("recsys_eval_propensity_eta", {"estimator": name}, e.eta)
            for k in range(e.theta.size):
                labels = {"position": str(k + 1), "estimator": name}
                fam.add("recsys_eval_propensity", labels, e.theta[k])
                fam.add("recsys_eval_propensity_lower", labels, e.lower[k])
                fam.add("recsys_eval_propensity_upper", labels, e.upper[k])
                fam.add("recsys_eval_propensity_clicks", labels, e.samples[k])
                fam.add("recsys_eval_propensity_fallback", labels, float(e.fallback[k]))

    def readout(self) -> Families:
        """Every window, A/B and propensity value now, read from the store: what
        ``/metrics`` and the dashboard both show."""
        return self._scrape()

    def attach(self, source: Callable[[], Families]) -> None:
        """Serve ``source()`` (a readout refreshed in the background) instead of reading
        the store at every collection."""
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # names vary with the data; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from (self._source or self.readout)().families()

    def _window(self, fam: Families, window: int, frontier: int) -> None:
        totals = cap_variants(
            window_totals(
                self.store.blocks(
                    window, frontier - window - self.layout.bucket_width(window), frontier
                ),
                window,
                frontier,
                self.layout,
            ),
            list(self.config.variants),
            self.config.max_variants,
        )
        label = self.window_label.get(window, format_duration_ms(window))
        starts = self._bucket_starts(window, frontier)
        variants = [v for v in totals if v != OTHER]
        compared = [(e.name, *e.arms(variants)) for e in self.experiments]
        compared = [c for c in compared if c[2]]
        ks = self.layout.ks
        groups = sorted({(v, c, k) for _, c, others in compared for v in others for k in ks})
        coverage, counts, unions = self._sketched(window, starts, variants, groups)
        for variant, block in totals.items():
            for k in self.layout.ks:
                fam.add(
                    "recsys_eval_coverage",
                    {"variant": variant, "k": str(k), "window": label},
                    coverage.get((variant, k), math.nan),
                )
            self._variant(fam, variant, block, label, coverage)
        for experiment, control, others in compared:
            for variant in others:
                for k in self.layout.ks:
                    union = unions[(variant, control, k)]
                    both = counts[(variant, k)] + counts[(control, k)] - union
                    labels = {"experiment": experiment, "variant": variant, "control": control}
                    fam.add(
                        "recsys_eval_ab_overlap",
                        {**labels, "k": str(k), "window": label, "measure": "jaccard"},
                        max(0.0, both) / union if union else math.nan,
                    )

    def _cached(
        self, key: tuple[int, str], compute: Callable[[], Any], done: Callable[[Any], bool] = bool
    ) -> Any:
        """``compute()``, kept ``sketch_refresh_s``; until ``done`` holds for the value
        (nothing yet, e.g. at start) it is asked again at every refresh."""
        now = time.monotonic()
        hit = self._sketches.get(key)
        fresh = hit is not None and now - hit[0] < self.sketch_refresh_s
        if hit is not None and fresh and done(hit[1]):
            return hit[1]
        value = compute()
        self._sketches[key] = (now, value)
        return value

    def _sketched(
        self,
        window: int,
        starts: list[int],
        variants: list[str],
        groups: list[tuple[str, str, int]],
    ) -> tuple[dict[Any, float], dict[Any, float], dict[tuple[str, str, int], float]]:
        """Coverage and distinct items per (variant, k), and the unions of the item sets
        of each (variant, control, k) behind Jaccard@K (|A ∩ B| = |A| + |B| − |A ∪ B|).
        Read together, for the same buckets, and kept ``sketch_refresh_s``: read at
        different refreshes they could describe different windows (an overlap below 0
        or above 1)."""

        def read() -> tuple[dict[Any, float], float, dict[tuple[str, str, int], float]]:
            counts, catalog_seen = self.store.distinct_items(window, starts, variants)
            unions = self.store.distinct_unions(window, starts, groups) if groups else []
            return counts, catalog_seen, dict(zip(groups, unions, strict=True))

        key = "items:" + ",".join(variants) + "|" + ";".join(map(str, groups))
        counts, catalog_seen, unions = self._cached((window, key), read)
        catalog = float(self.config.catalog_size) or catalog_seen
        coverage = {
            key: min(1.0, n / catalog) if catalog else math.nan for key, n in counts.items()
        }
        return coverage, counts, unions

    def _bucket_starts(self, window: int, frontier: int) -> list[int]:
        width = self.layout.bucket_width(window)
        first = frontier - window - (frontier - window) % width
        return list(range(first, frontier + 1, width))

    def _diversity(self, block: FloatArray, k: int) -> float:
        lists, total = self.layout.diversity_columns(k)
        n = float(block[..., lists].sum())
        return float(block[..., total].sum()) / n if n else math.nan

    def _mean(self, block: FloatArray, metric: str, k: int) -> float:
        return self.layout.schema.mean(block, metric, k, self.config.zero_relevance)

    def _variant(
        self,
        fam: Families,
        variant: str,
        block: FloatArray,
        window: str,
        coverage: dict[tuple[str, int], float],
    ) -> None:
        block = block.sum(axis=1)  # (cohort, row): user buckets only matter for A/B tests
        for cohort, index in COHORTS.items():
            part = block.sum(axis=0) if index is None else block[index]
            base = {"variant": variant, "window": window, "cohort": cohort}
            fam.add("recsys_eval_requests", base, float(part[..., 0].sum()))
            fam.add("recsys_eval_engaged_requests", base, float(part[..., 1].sum()))
            for k in self.layout.ks:
                kl = {**base, "k": str(k)}
                for spec, family in EXPORTED:
                    labels = {**kl, **dict(spec.labels)}
                    fam.add(family, labels, self._mean(part, spec.name, k))
        has_rbo, rbo_sum = self.layout.rbo_columns()
        with_shadow = float(block[..., has_rbo].sum())
        if with_shadow:
            labels = {
                "experiment": "shadow",
                "variant": variant,
                "control": self.config.control or "shadow",
                "k": "all",
                "window": window,
                "measure": "rbo",
            }
            fam.add(
                "recsys_eval_ab_overlap", labels, float(block[..., rbo_sum].sum()) / with_shadow
            )
        for k in self.layout.ks:
            fam.add(
                "recsys_eval_diversity",
                {"variant": variant, "k": str(k), "window": window},
                self._diversity(block, k),
            )
        terms: dict[str, float] = {}
        for name in self.config.composite:
            metric, _, cut = name.partition("@")
            if metric == "coverage" and cut:
                terms[name] = coverage.get((variant, int(cut)), math.nan)
            elif metric == "diversity" and cut and int(cut) in self.layout.ks:
                terms[name] = self._diversity(block, int(cut))
            elif cut and (metric, int(cut)) in self.rules.columns:
                terms[name] = self._mean(block, metric, int(cut))
            # else: a term the live export does not have, so the score is NaN
        fam.add(
            "recsys_eval_composite_score",
            {"variant": variant, "window": window},
            composite_score(terms, dict(self.config.composite)),
        )

    def _experiments(self, fam: Families) -> None:
        """Each experiment's A/B readout from its cumulative statistics."""
        allowed = set(self.config.variants)
        for experiment in self.experiments:
            blocks = self.store.experiment_blocks(experiment.name)
            users = self.store.exposures(experiment.name)
            if allowed:  # the allow-list bounds the variant label
                blocks = {v: b for v, b in blocks.items() if v in allowed}
                users = {v: n for v, n in users.items() if v in allowed}
            keep = sorted(users, key=lambda v: -users[v])[: self.config.max_variants]
            blocks = {v: b for v, b in blocks.items() if v in keep}
            users = {v: users[v] for v in keep}
            readout = read_experiment(experiment, blocks, users, self.rules, self.tracker)
            self._render(fam, readout)

    def _render(self, fam: Families, readout: ExperimentReadout) -> None:
        name = readout.name
        fam.add("recsys_eval_srm_p_value", {"experiment": name}, readout.srm_p_sequential)
        for variant, n in readout.users.items():
            fam.add("recsys_eval_ab_users", {"experiment": name, "variant": variant}, float(n))
            fam.add(
                "recsys_eval_ab_requests",
                {"experiment": name, "variant": variant},
                readout.requests[variant],
            )
        ready: dict[str, bool] = {}
        for c in readout.comparisons:
            labels = {
                "experiment": name,
                "variant": c.variant,
                "control": c.control,
                "k": str(c.k),
                "adjusted": c.adjusted,
            }
            for suffix, value, lifted in (
                ("", c.diff, c.lift[0]),
                ("_lower", c.lower, c.lift[1]),
                ("_upper", c.upper, c.lift[2]),
            ):
                fam.add("recsys_eval_ab_ndcg_diff" + suffix, labels, value)
                fam.add("recsys_eval_ab_ndcg_lift" + suffix, labels, lifted)
            fam.add("recsys_eval_ab_p_value", {**labels, "method": "sequential"}, c.p_sequential)
            fam.add("recsys_eval_ab_p_value", {**labels, "method": "fixed"}, c.p_fixed)
            if c.variant not in ready:
                ready[c.variant] = c.ready
                self._log_status(name, c.variant, c.reason)
                fam.add(
                    "recsys_eval_ab_ready",
                    {"experiment": name, "variant": c.variant, "control": c.control},
                    float(c.ready),
                )

    def _log_status(self, experiment: str, variant: str, reason: str) -> None:
        """One log line when an arm's inference is withheld or becomes available."""
        key = (experiment, variant)
        if self._status.get(key) != reason:
            self._status[key] = reason
            if reason:
                log.info("A/B %s/%s: no interval or p-value yet: %s", experiment, variant, reason)
            else:
                log.info("A/B %s/%s: interval and p-values available", experiment, variant)
