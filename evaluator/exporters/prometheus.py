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

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.core import (
    Metric,
)
from prometheus_client.registry import Collector

from evaluator.config import ExperimentSettings, Settings
from evaluator.exporters.families import Families, new_families
from evaluator.propensity_estimation import estimate_all
from evaluator.stats import (
    SequentialTracker,
    fixed_horizon,
    ratio_estimate,
    sequential,
    srm_p_value,
)
from evaluator.stores.base import FloatArray, StateStore
from evaluator.timeutil import format_duration_ms, parse_duration_ms
from evaluator.windows_read import OTHER, cap_variants, window_totals

COHORTS = {"all": None, "cold_start": 0, "established": 1}
RATE_METRICS = {"mrr": "mrr", "hit_rate": "hit_rate"}
"""Per-request rates exported besides nDCG; precision and recall stay in replay reports."""


@dataclass(frozen=True, slots=True)
class Experiment:
    """Variants compared with one control, and their expected traffic split."""

    name: str
    variants: list[str]
    control: str
    split: dict[str, float]


class WindowCollector(Collector):
    """Reads window aggregates from the store when Prometheus scrapes."""

    def __init__(
        self,
        store: StateStore,
        settings: Settings,
        watermark: Callable[[], int | None],
        sketch_refresh_s: float = 60.0,
    ) -> None:
        self.store = store
        self.settings = settings
        self.layout = store.layout
        self.watermark = watermark
        self.tracker = SequentialTracker()
        self.sketch_refresh_s = sketch_refresh_s
        """Coverage and overlap come from sketches that are costly to merge: refreshed at
        most this often (they describe windows of 5 minutes and more)."""
        self._sketches: dict[tuple[int, str], tuple[float, Any]] = {}
        self.window_label = {
            parse_duration_ms(size): size.strip()
            if isinstance(size, str)
            else format_duration_ms(size)
            for size in settings.windows.sizes
        }
        columns = self.layout.columns()
        self.col = {mk: 2 + i for i, mk in enumerate(columns)}
        self.n_values = len(columns)

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
        if self.settings.propensity.collect:
            self._propensity(fam)
        return fam

    def _propensity(self, fam: Families) -> None:
        p = self.settings.propensity
        estimates = self._cached(
            (0, "propensity"),  # cached like the sketches; at most 10 s old
            lambda: estimate_all(self.store.propensity_counts(), p.positions, p.min_clicks),
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

    def collect(self) -> Iterator[Metric]:
        yield from self._scrape().families()

    def exposition(self) -> bytes:
        """The same metrics as :meth:`collect`, as exposition text (much faster)."""
        return self._scrape().text().encode()

    def _window(self, fam: Families, window: int, frontier: int) -> None:
        ab = self.settings.ab
        totals = cap_variants(
            window_totals(
                self.store.blocks(
                    window, frontier - window - self.layout.bucket_width(window), frontier
                ),
                window,
                frontier,
                self.layout,
            ),
            ab.variants,
            ab.max_variants,
        )
        label = self.window_label.get(window, format_duration_ms(window))
        starts = self._bucket_starts(window, frontier)
        coverage, counts = self._coverage(window, starts, [v for v in totals if v != OTHER])
        for variant, block in totals.items():
            for k in self.layout.ks:
                fam.add(
                    "recsys_eval_coverage",
                    {"variant": variant, "k": str(k), "window": label},
                    coverage.get((variant, k), math.nan),
                )
            self._variant(fam, variant, block, label, coverage)
        for experiment in self._experiments([v for v in totals if v != OTHER]):
            members = {v: totals[v] for v in experiment.variants}
            self._ab(fam, members, label, experiment)
            self._overlap(fam, window, starts, counts, label, experiment=experiment)
            requests = [float(b[..., 0].sum()) for b in members.values()]
            split = experiment.split
            weights = np.asarray([split.get(v, 0.0) for v in members]) if split else None
            fam.add(
                "recsys_eval_srm_p_value",
                {"experiment": experiment.name, "window": label},
                srm_p_value(np.asarray(requests), weights),
            )

    def _cached(self, key: tuple[int, str], compute: Callable[[], Any]) -> Any:
        now = time.monotonic()
        hit = self._sketches.get(key)
        max_age = min(self.sketch_refresh_s, 10.0) if key[1] == "propensity" else None
        fresh = hit is not None and now - hit[0] < (max_age or self.sketch_refresh_s)
        if hit is not None and fresh and hit[1]:  # nothing yet (e.g. at start): ask again
            return hit[1]
        value = compute()
        self._sketches[key] = (now, value)
        return value

    def _coverage(
        self, window: int, starts: list[int], variants: list[str]
    ) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
        """Coverage per (variant, k), and the distinct-item counts behind it."""
        counts, catalog_seen = self._cached(
            (window, "items:" + ",".join(variants)),
            lambda: self.store.distinct_items(window, starts, variants),
        )
        catalog = float(self.settings.metrics.catalog_size) or catalog_seen
        coverage = {
            key: min(1.0, n / catalog) if catalog else math.nan for key, n in counts.items()
        }
        return coverage, counts

    def _overlap(
        self,
        fam: Families,
        window: int,
        starts: list[int],
        counts: dict[tuple[str, int], float],
        label: str,
        *,
        experiment: Experiment,
    ) -> None:
        """Jaccard@K between each variant's and the control's item sets (sketch-based:
        |A ∩ B| = |A| + |B| − |A ∪ B|)."""
        variants, control = experiment.variants, experiment.control
        groups = [(v, control, k) for v in variants if v != control for k in self.layout.ks]
        unions = self._cached(
            (window, "unions:" + ",".join(variants)),
            lambda: self.store.distinct_unions(window, starts, groups),
        )
        for (variant, _, k), union in zip(groups, unions, strict=True):
            both = counts[(variant, k)] + counts[(control, k)] - union
            fam.add(
                "recsys_eval_ab_overlap",
                {
                    "experiment": experiment.name,
                    "variant": variant,
                    "control": control,
                    "k": str(k),
                    "window": label,
                    "measure": "jaccard",
                },
                max(0.0, both) / union if union else math.nan,
            )

    def _experiments(self, variants: list[str]) -> list[Experiment]:
        """Configured experiments (or one ``default`` over every variant) with 2+ variants."""
        ab = self.settings.ab
        specs = ab.experiments or {
            "default": ExperimentSettings(control=ab.control, variants=[], split=ab.split)
        }
        out = []
        for name, spec in specs.items():
            members = [v for v in variants if not spec.variants or v in spec.variants]
            if len(members) >= 2:
                control = spec.control if spec.control in members else sorted(members)[0]
                out.append(Experiment(name, members, control, spec.split))
        return out

    def _bucket_starts(self, window: int, frontier: int) -> list[int]:
        width = self.layout.bucket_width(window)
        first = frontier - window - (frontier - window) % width
        return list(range(first, frontier + 1, width))

    def _diversity(self, block: FloatArray, k: int) -> float:
        lists, total = self.layout.diversity_columns(k)
        n = float(block[..., lists].sum())
        return float(block[..., total].sum()) / n if n else math.nan

    def _mean(self, block: FloatArray, metric: str, k: int) -> float:
        denom_col = 1 if self.settings.metrics.zero_relevance == "skip" else 0
        denom = float(block[..., denom_col].sum())
        return float(block[..., self.col[(metric, k)]].sum()) / denom if denom else math.nan

    def _variant(
        self,
        fam: Families,
        variant: str,
        block: FloatArray,
        window: str,
        coverage: dict[tuple[str, int], float],
    ) -> None:
        block = block.sum(axis=1)  # (cohort, row): user buckets only matter for A/B tests
        composite = 0.0
        for cohort, index in COHORTS.items():
            part = block.sum(axis=0) if index is None else block[index]
            base = {"variant": variant, "window": window, "cohort": cohort}
            fam.add("recsys_eval_requests", base, float(part[..., 0].sum()))
            fam.add("recsys_eval_engaged_requests", base, float(part[..., 1].sum()))
            for k in self.layout.ks:
                kl = {**base, "k": str(k)}
                fam.add(
                    "recsys_eval_ndcg", {**kl, "adjusted": "false"}, self._mean(part, "ndcg", k)
                )
                fam.add(
                    "recsys_eval_ndcg",
                    {**kl, "adjusted": "true"},
                    self._mean(part, "ndcg_adjusted", k),
                )
                for name, metric in RATE_METRICS.items():
                    fam.add(f"recsys_eval_{name}", kl, self._mean(part, metric, k))
        has_rbo, rbo_sum = self.layout.rbo_columns()
        with_shadow = float(block[..., has_rbo].sum())
        if with_shadow:
            labels = {
                "experiment": "shadow",
                "variant": variant,
                "control": self.settings.ab.control or "shadow",
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
        for name, weight in self.settings.metrics.composite.items():
            metric, _, cut = name.partition("@")
            if metric == "coverage" and cut:
                composite += weight * coverage.get((variant, int(cut)), math.nan)
            elif metric == "diversity" and cut and int(cut) in self.layout.ks:
                composite += weight * self._diversity(block, int(cut))
            elif cut and (metric, int(cut)) in self.col:
                composite += weight * self._mean(block, metric, int(cut))
            else:  # a term the live export does not have: no composite
                composite = math.nan
        fam.add("recsys_eval_composite_score", {"variant": variant, "window": window}, composite)

    def _ab(
        self, fam: Families, totals: dict[str, FloatArray], window: str, experiment: Experiment
    ) -> None:
        ab = self.settings.ab
        control = experiment.control
        for k in self.layout.ks:
            for adjusted, metric in (("false", "ndcg"), ("true", "ndcg_adjusted")):
                col = self.col[(metric, k)]
                ref = totals[control].sum(axis=0)
                c_est = ratio_estimate(ref[:, col], ref[:, 0])
                for variant, block in totals.items():
                    if variant == control:
                        continue
                    per = block.sum(axis=0)
                    v_est = ratio_estimate(per[:, col], per[:, 0])
                    labels = {
                        "experiment": experiment.name,
                        "variant": variant,
                        "control": control,
                        "k": str(k),
                        "window": window,
                        "adjusted": adjusted,
                    }
                    seq = self.tracker.update(
                        tuple(labels.values()), sequential(c_est, v_est, ab.alpha, ab.tuning)
                    )
                    fixed = fixed_horizon(c_est, v_est, ab.alpha)
                    lift = seq.lift()
                    for suffix, value, lifted in (
                        ("", seq.diff, lift[0]),
                        ("_lower", seq.lower, lift[1]),
                        ("_upper", seq.upper, lift[2]),
                    ):
                        fam.add("recsys_eval_ab_ndcg_diff" + suffix, labels, value)
                        fam.add("recsys_eval_ab_ndcg_lift" + suffix, labels, lifted)
                    fam.add(
                        "recsys_eval_ab_p_value", {**labels, "method": "sequential"}, seq.p_value
                    )
                    fam.add("recsys_eval_ab_p_value", {**labels, "method": "fixed"}, fixed.p_value)
