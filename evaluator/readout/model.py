"""The read model: what the evaluator says about each variant, window and experiment.

One model, three renderings: the Prometheus collector
(:mod:`evaluator.adapters.prometheus.collector`), the dashboard's snapshots
(:mod:`evaluator.adapters.web.dashboard`) and replay's report
(:mod:`evaluator.readout.report`). Live, it is read from the store
(:mod:`evaluator.readout.live`); in replay, from the rows of the whole file. The values
are computed here once, so the three always agree. Pure: no I/O. NaN means "no data".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from evaluator.core.ab.readout import ExperimentReadout
from evaluator.core.ab.stats import ratio_estimate
from evaluator.core.aggregate import FloatArray
from evaluator.core.metrics.composite import composite_score
from evaluator.core.metrics.registry import METRICS
from evaluator.core.propensity.estimation import Estimate
from evaluator.core.regression import Detection
from evaluator.core.rows import RowSchema

NAN = float("nan")


@dataclass(frozen=True, slots=True)
class GroupView:
    """Counts and metric means of one group of finalised requests (a variant or cohort)."""

    requests: float
    engaged: float
    means: Mapping[tuple[str, int], float]
    """(metric, k) -> mean over the group's requests (NaN: none)."""
    stderr: Mapping[tuple[str, int], float] = field(default_factory=dict)
    """(metric, k) of :data:`WITH_STDERR` -> the mean's standard error with the user
    bucket as the unit (where the rows keep user buckets: live windows)."""


@dataclass(frozen=True, slots=True)
class VariantView:
    """One variant over one window (replay: over the whole file)."""

    variant: str
    cohorts: Mapping[str, GroupView]
    """``all``, ``cold_start`` and ``established``."""
    coverage: Mapping[int, float]
    diversity: Mapping[int, float]
    composite: float
    shadow_rbo: float = NAN
    """Mean rank-biased overlap with the control's shadow rankings (NaN: none)."""
    users: float = NAN
    """Distinct users with a finalised request (live: a HyperLogLog estimate; replay:
    exact; NaN: not kept, such as the capped ``other`` variant)."""


@dataclass(frozen=True, slots=True)
class Overlap:
    """Jaccard@K of a variant's recommended item set with its control's, in a window."""

    experiment: str
    variant: str
    control: str
    k: int
    jaccard: float


@dataclass(frozen=True, slots=True)
class WindowView:
    label: str
    variants: list[VariantView]
    overlaps: list[Overlap] = field(default_factory=list)
    catalog: int = 0
    """Items in the catalog coverage divides by (replay's report states it)."""


@dataclass(slots=True)
class ReadModel:
    """Everything read at one moment."""

    watermark_ms: int | None = None
    open_requests: int = 0
    due_requests: int = 0
    windows: list[WindowView] = field(default_factory=list)
    experiments: list[ExperimentReadout] = field(default_factory=list)
    propensity: Mapping[str, Estimate] = field(default_factory=dict)
    regression: Mapping[tuple[str, int], Detection] = field(default_factory=dict)
    """Per (variant, K), the regression detector at the readout (none: disabled)."""
    provisional_age_ms: int = 0
    """The age of the provisional nDCG in :attr:`regression`."""
    maturity: Mapping[tuple[str, int], FloatArray] = field(default_factory=dict)
    """Per (variant, K), the maturity curve: the share of the final nDCG given by the
    interactions of each of :attr:`maturity_ages_ms` (:mod:`evaluator.core.maturity`)."""
    maturity_ages_ms: tuple[int, ...] = ()


def group_view(row: FloatArray, schema: RowSchema, ks: tuple[int, ...], policy: str) -> GroupView:
    """A group's view from its summed statistics row (any leading shape is summed); rows
    of shape (..., user bucket, column) also give the standard errors."""
    means = {(m, k): schema.mean(row, m, k, policy) for m in METRICS for k in ks}
    stderr: dict[tuple[str, int], float] = {}
    if row.ndim >= 2:
        per_bucket = row.reshape(-1, *row.shape[-2:]).sum(axis=0)
        for m in WITH_STDERR:
            for k in ks:
                if schema.has(m, k):
                    stderr[(m, k)] = standard_error(per_bucket, schema, (m, k), policy)
    return GroupView(float(row[..., 0].sum()), float(row[..., 1].sum()), means, stderr)


WITH_STDERR = ("ndcg", "ndcg_adjusted")
"""The metrics whose window means are exported with a standard error (alerting needs
them; every metric would double the series)."""


def standard_error(
    per_bucket: FloatArray, schema: RowSchema, metric: tuple[str, int], policy: str
) -> float:
    """The delta-method standard error of a mean over user buckets (the unit: one user's
    requests are correlated; :func:`evaluator.core.ab.stats.ratio_estimate`)."""
    value = per_bucket[:, schema.value(*metric)]
    count = per_bucket[:, schema.denominator(*metric, policy)]
    variance = ratio_estimate(value, count).variance
    return math.sqrt(variance) if math.isfinite(variance) and variance >= 0 else NAN


def composite_of(
    overall: GroupView,
    coverage: Mapping[int, float],
    diversity: Mapping[int, float],
    weights: Mapping[str, float],
) -> float:
    """The configured weighted sum (``metric@k`` terms); a term the view lacks is NaN,
    and so is the score."""
    terms: dict[str, float] = {}
    for name in weights:
        metric, _, cut = name.partition("@")
        if not cut.isdigit():
            continue
        k = int(cut)
        if metric == "coverage":
            terms[name] = coverage.get(k, NAN)
        elif metric == "diversity":
            terms[name] = diversity.get(k, NAN)
        else:
            terms[name] = overall.means.get((metric, k), NAN)
    return composite_score(terms, weights)


def finite(value: float) -> float | None:
    """JSON's view of a value: None where there is no data."""
    return value if math.isfinite(value) else None
