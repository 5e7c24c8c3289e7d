"""The live read model, read from the state store (every instance reads the same).

Window views sum the buckets of each window per variant; coverage and overlap come
from sketches that are costly to merge, so they are re-read at most every
``sketch_refresh_s``; each experiment is read from its cumulative statistics
since its start. Variants are capped (``ab.max_variants`` or the allow-list, the rest
folded into ``other``) so the labels the views feed stay bounded.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from evaluator.core.ab.interleaving import is_pair
from evaluator.core.ab.readout import ExperimentReadout, ReadoutRules, read_experiment
from evaluator.core.ab.stats import SequentialTracker
from evaluator.core.experiments import Experiment
from evaluator.core.propensity.estimation import Estimate, estimate_all
from evaluator.core.timeutil import format_duration_ms
from evaluator.engine.commit_payload import USERS
from evaluator.engine.ports import FloatArray, StateStore
from evaluator.readout.config import ReadoutConfig
from evaluator.readout.model import (
    NAN,
    Overlap,
    ReadModel,
    VariantView,
    WindowView,
    composite_of,
    group_view,
)
from evaluator.readout.regression import live_detections
from evaluator.readout.windows import OTHER, cap_variants, window_totals

log = logging.getLogger(__name__)

COHORTS = {"all": None, "cold_start": 0, "established": 1}
"""Cohort label -> index on a block's cohort axis (None: all of them)."""


class LiveReader:
    """Reads the read model from the store (see the module docstring)."""

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
        self._sketches: dict[tuple[int, str], tuple[float, Any]] = {}
        self.rules = config.rules(self.layout)
        self._status: dict[tuple[str, str], str] = {}

    def read(self) -> ReadModel:
        model = ReadModel()
        frontier = self.watermark()
        if frontier is not None:
            model.watermark_ms = frontier
            model.open_requests, model.due_requests = self.store.open_requests(frontier)
            model.windows = [self._window(w, frontier) for w in self.layout.windows_ms]
            model.experiments = [self._experiment(e) for e in self.config.experiments]
            rules = self.config.regression
            if rules is not None and model.windows:
                shown = {v.variant for v in model.windows[-1].variants}
                policy = self.config.zero_relevance
                found = live_detections(self.store, rules, frontier, policy, shown)
                model.regression, model.maturity = found
                model.provisional_age_ms = rules.age_ms
                model.maturity_ages_ms = rules.maturity_ages_ms
        if self.config.propensity is not None:
            model.propensity = self._propensity(*self.config.propensity)
        return model

    def _propensity(self, positions: int, min_clicks: int) -> dict[str, Estimate]:
        found: dict[str, Estimate] = self._cached(
            (0, "propensity"),  # cached like the sketches (EM's intervals take ten refits)
            lambda: estimate_all(self.store.propensity_counts(), positions, min_clicks),
            done=lambda found: any(math.isfinite(e.eta) for e in found.values()),
        )
        return found

    def _window(self, window: int, frontier: int) -> WindowView:
        since = frontier - window - self.layout.bucket_width(window)
        totals = cap_variants(
            window_totals(
                self.store.blocks(window, since, frontier), window, frontier, self.layout
            ),
            list(self.config.variants),
            self.config.max_variants,
        )
        label = self.config.window_labels.get(window, format_duration_ms(window))
        starts = self._bucket_starts(window, frontier)
        variants = [v for v in totals if v != OTHER]
        compared = [(e.name, *e.arms(variants)) for e in self.config.experiments]
        compared = [c for c in compared if c[2]]
        ks = self.layout.ks
        groups = sorted({(v, c, k) for _, c, others in compared for v in others for k in ks})
        coverage, counts, unions = self._sketched(window, starts, variants, groups)
        views = [
            self._variant(v, block, coverage, counts.get((v, USERS), NAN))
            for v, block in totals.items()
        ]
        overlaps = []
        for experiment, control, others in compared:
            for variant in others:
                for k in ks:
                    union = unions[(variant, control, k)]
                    both = counts[(variant, k)] + counts[(control, k)] - union
                    jaccard = max(0.0, both) / union if union else NAN
                    overlaps.append(Overlap(experiment, variant, control, k, jaccard))
        return WindowView(label, views, overlaps)

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

    def _variant(
        self, variant: str, block: FloatArray, coverage: dict[tuple[str, int], float], users: float
    ) -> VariantView:
        """One variant's view of a window's summed blocks (``users``: the sketch's count
        of its distinct users)."""
        # (cohort, user bucket, row): the user buckets give the means' standard errors
        schema, ks, policy = self.layout.schema, self.layout.ks, self.config.zero_relevance
        cohorts = {
            name: group_view(block if index is None else block[index], schema, ks, policy)
            for name, index in COHORTS.items()
        }
        covered = {k: coverage.get((variant, k), NAN) for k in ks}
        diversity = {}
        for k in ks:
            lists, total = self.layout.diversity_columns(k)
            n = float(block[..., lists].sum())
            diversity[k] = float(block[..., total].sum()) / n if n else NAN
        has_rbo, rbo_sum = self.layout.rbo_columns()
        with_shadow = float(block[..., has_rbo].sum())
        rbo = float(block[..., rbo_sum].sum()) / with_shadow if with_shadow else NAN
        score = composite_of(cohorts["all"], covered, diversity, self.config.composite)
        return VariantView(variant, cohorts, covered, diversity, score, rbo, users)

    def _experiment(self, experiment: Experiment) -> ExperimentReadout:
        """An experiment's A/B readout from its cumulative statistics."""
        name = experiment.name
        allowed = set(self.config.variants)
        blocks = self.store.experiment_blocks(name)
        pairs = busiest_pairs(blocks, self.rules, self.config.max_variants)
        users = self.store.exposures(name)
        if allowed:  # the allow-list bounds the variant label
            blocks = {v: b for v, b in blocks.items() if v in allowed}
            users = {v: n for v, n in users.items() if v in allowed}
        keep = sorted(users, key=lambda v: -users[v])[: self.config.max_variants]
        blocks = {v: b for v, b in blocks.items() if v in keep} | pairs
        users = {v: users[v] for v in keep}
        readout = read_experiment(experiment, blocks, users, self.rules, self.tracker)
        self._log_status(readout)
        return readout

    def _log_status(self, readout: ExperimentReadout) -> None:
        """One log line when an arm's inference is withheld or becomes available."""
        seen: set[str] = set()
        for c in readout.comparisons:
            if c.variant in seen:
                continue
            seen.add(c.variant)
            key = (readout.name, c.variant)
            if self._status.get(key) != c.reason:
                self._status[key] = c.reason
                if c.reason:
                    log.info(
                        "A/B %s/%s: no interval or p-value yet: %s",
                        readout.name,
                        c.variant,
                        c.reason,
                    )
                else:
                    log.info("A/B %s/%s: interval and p-values available", *key)


def busiest_pairs(
    blocks: dict[str, FloatArray], rules: ReadoutRules, most: int
) -> dict[str, FloatArray]:
    """The ranker pairs among an experiment's blocks, the ``most`` with the most
    informative requests (their names are labels: bounded like the variants)."""
    pairs = {k: b for k, b in blocks.items() if is_pair(k)}
    if rules.interleaving is None or len(pairs) <= most:
        return pairs
    requests = rules.interleaving[1]
    keep = sorted(pairs, key=lambda k: -float(pairs[k][..., requests].sum()))[:most]
    return {k: pairs[k] for k in keep}
