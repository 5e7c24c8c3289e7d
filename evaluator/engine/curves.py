"""The propensity curve each window bucket is scored with (``propensity.model =
"estimated"``): fitted from the store's estimator counters and fixed per bucket in the
store, so every instance and partition scores a bucket with the same curve."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from evaluator.core.due import Due
from evaluator.core.finalise import FinaliseConfig
from evaluator.core.propensity.estimation import estimate
from evaluator.engine.plan import Estimating, with_curve
from evaluator.engine.ports import StateStore

ESTIMATE_EVERY_S = 30.0
"""How often the curve offered to new window buckets is re-fitted."""


class BucketCurves:
    """Groups due requests by the finalisation config of their bucket."""

    def __init__(
        self,
        store: StateStore,
        config: FinaliseConfig,
        estimating: Estimating | None,
        finalised: Callable[[], int],
    ) -> None:
        """``estimating``: how curves are fitted (None: ``config``'s fixed model)."""
        self.store = store
        self.estimating = estimating
        self.config = config
        self.finalised = finalised
        """Requests finalised so far by this process (a re-fit trigger)."""
        self._configs: dict[int, FinaliseConfig] = {}
        self._fit: tuple[float, int, tuple[float, ...] | None] | None = None
        """(monotonic time, requests finalised, curve) of the last fit."""

    def group(self, due: Due) -> list[tuple[FinaliseConfig, Due]]:
        """With a fixed model, one group; with ``estimated``, one per bucket (of the
        shortest window) that the requests' deadlines fall in (in order of first
        appearance, each group's requests in their order)."""
        if self.estimating is None or not len(due):
            return [(self.config, due)]
        layout = self.config.layout
        window = min(layout.windows_ms)
        starts = layout.bucket_start(window, due.ms + self.config.deadline(0))
        values, first, of_row = np.unique(starts, return_index=True, return_inverse=True)
        if values.size == 1:
            return [(self._bucket(int(values[0])), due)]
        groups = []
        for g in np.argsort(first).tolist():
            rows = np.flatnonzero(of_row.reshape(-1) == g)
            groups.append((self._bucket(int(values[g])), due.take(rows)))
        return groups

    def _estimate(self) -> tuple[float, ...] | None:
        """The estimator's current curve: re-fitted when none exists yet, every
        ESTIMATE_EVERY_S seconds, and whenever 10% more requests (at least 1,000) were
        finalised since the last fit, so an early curve fitted on little data is soon
        replaced."""
        now, done = time.monotonic(), self.finalised()
        cached = self._fit
        if cached is not None and cached[2] is not None:
            fitted_at, fitted_done, curve = cached
            fresh = now - fitted_at < ESTIMATE_EVERY_S
            if fresh and done - fitted_done < max(1_000, fitted_done // 10):
                return curve
        p = self.estimating
        assert p is not None  # only asked when estimating
        counts = self.store.propensity_counts()
        fitted = estimate(
            counts, p.estimator, p.positions, p.min_clicks, intervals=False
        ).curve()  # scoring needs the curve only
        self._fit = (now, done, fitted)
        return fitted

    def _bucket(self, bucket_ms: int) -> FinaliseConfig:
        config = self._configs.get(bucket_ms)
        if config is None:
            current = self._estimate()
            curve = self.store.propensity_curve(bucket_ms, current) if current else None
            config = with_curve(self.config, curve)
            if len(self._configs) > 64:
                self._configs.clear()
            self._configs[bucket_ms] = config
        return config
