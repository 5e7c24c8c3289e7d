"""Prometheus export of the read model (:mod:`evaluator.readout.live`), read from the
state store when collected, plus process counters.

Window metrics come from the shared store, so every instance reports the same
global values and a restart loses nothing; aggregate across instances with
``max by (...)`` (or ``avg``), never ``sum``. Process counters are per instance;
aggregate them with ``sum``. Labels are bounded: variants are capped
(``ab.max_variants`` or the ``ab.variants`` allow-list, the rest folded into
``other``) and no user or item id ever becomes a label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from evaluator.adapters.prometheus.families import Families, new_families
from evaluator.core.ab.readout import Comparison, ExperimentReadout
from evaluator.core.metrics.registry import REGISTRY
from evaluator.core.propensity.estimation import Estimate
from evaluator.core.regression import Detection
from evaluator.core.timeutil import format_duration_ms
from evaluator.readout.live import LiveReader
from evaluator.readout.model import ReadModel, VariantView, WindowView

EXPORTED = [(m, m.family) for m in REGISTRY if m.family is not None]
"""The registered metrics exported as gauges, with their family."""


class WindowCollector(Collector):
    """Renders the read model as gauge families when Prometheus scrapes."""

    def __init__(self, reader: LiveReader) -> None:
        self.reader = reader
        self.control = reader.config.control
        self._source: Callable[[], ReadModel] | None = None
        self._rendered: tuple[ReadModel, Families] | None = None

    def read(self) -> ReadModel:
        """Every window, A/B and propensity value now, read from the store: what
        ``/metrics`` and the dashboard both show."""
        return self.reader.read()

    def readout(self) -> Families:
        """The read model now, as gauge families."""
        return render(self.read(), self.control)

    def attach(self, source: Callable[[], ReadModel]) -> None:
        """Serve ``source()`` (a model refreshed in the background) instead of reading
        the store at every collection."""
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # names vary with the data; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        if self._source is None:
            yield from self.readout().families()
            return
        model = self._source()
        rendered = self._rendered
        if rendered is None or rendered[0] is not model:  # rendered once per refresh
            rendered = self._rendered = (model, render(model, self.control))
        yield from rendered[1].families()


def render(model: ReadModel, control: str = "") -> Families:
    """The read model as gauge families (``control``: the shadow overlap's label)."""
    fam = new_families()
    if model.watermark_ms is not None:
        fam.add("recsys_eval_watermark_seconds", {}, model.watermark_ms / 1000.0)
        fam.add("recsys_eval_open_requests", {}, model.open_requests)
        fam.add("recsys_eval_due_requests", {}, model.due_requests)
    for window in model.windows:
        _window(fam, window, control)
    for readout in model.experiments:
        _experiment(fam, readout)
    _propensity(fam, model.propensity)
    _regression(fam, model.regression, format_duration_ms(model.provisional_age_ms))
    ages = [format_duration_ms(a) for a in model.maturity_ages_ms]
    for (variant, k), shares in model.maturity.items():
        for age, share in zip(ages, shares.tolist(), strict=True):
            labels = {"variant": variant, "k": str(k), "age": age}
            fam.add("recsys_eval_ndcg_maturity", labels, share)
    return fam


def _regression(fam: Families, found: Mapping[tuple[str, int], Detection], age: str) -> None:
    for (variant, k), d in found.items():
        labels = {"variant": variant, "k": str(k)}
        fam.add("recsys_eval_regression_armed", labels, float(d.armed))
        fam.add("recsys_eval_regression", labels, float(d.regression))  # 0 while not armed
        if not d.armed:
            continue
        fam.add("recsys_eval_regression_score", labels, d.score)
        if d.since_ms is not None:
            fam.add("recsys_eval_regression_since_timestamp_seconds", labels, d.since_ms / 1000)
        for name, value in (("slot", d.current), ("baseline", d.baseline)):
            if value is not None:
                fam.add(f"recsys_eval_regression_{name}_ndcg", labels, value)
    for (variant, k), d in found.items():
        if d.provisional is None or d.band is None:
            continue
        labels = {"variant": variant, "k": str(k)}
        fam.add("recsys_eval_provisional_ndcg", labels, d.provisional)
        fam.add("recsys_eval_provisional_ndcg_lower", labels, d.provisional - d.band)
        fam.add("recsys_eval_provisional_ndcg_upper", labels, d.provisional + d.band)
        aged = {**labels, "age": age}
        fam.add("recsys_eval_provisional_maturity", aged, d.maturity or math.nan)
        fam.add("recsys_eval_provisional_partial_ndcg", aged, d.partial or 0.0)


def _window(fam: Families, window: WindowView, control: str) -> None:
    for view in window.variants:
        for k, value in view.coverage.items():
            labels = {"variant": view.variant, "k": str(k), "window": window.label}
            fam.add("recsys_eval_coverage", labels, value)
        _variant(fam, view, window.label, control)
    for o in window.overlaps:
        labels = {"experiment": o.experiment, "variant": o.variant, "control": o.control}
        labels |= {"k": str(o.k), "window": window.label, "measure": "jaccard"}
        fam.add("recsys_eval_ab_overlap", labels, o.jaccard)


def _variant(fam: Families, view: VariantView, window: str, control: str) -> None:
    for cohort, group in view.cohorts.items():
        base = {"variant": view.variant, "window": window, "cohort": cohort}
        fam.add("recsys_eval_requests", base, group.requests)
        fam.add("recsys_eval_engaged_requests", base, group.engaged)
        for k in sorted({k for _, k in group.means}):
            kl = {**base, "k": str(k)}
            for spec, family in EXPORTED:
                labels = {**kl, **dict(spec.labels)}
                fam.add(family, labels, group.means[(spec.name, k)])
                if (spec.name, k) in group.stderr:
                    fam.add(family + "_stderr", labels, group.stderr[(spec.name, k)])
    labels = {"experiment": "shadow", "variant": view.variant, "control": control or "shadow"}
    labels |= {"k": "all", "window": window, "measure": "rbo"}
    fam.add("recsys_eval_ab_overlap", labels, view.shadow_rbo)
    for k, value in view.diversity.items():
        fam.add(
            "recsys_eval_diversity", {"variant": view.variant, "k": str(k), "window": window}, value
        )
    fam.add(
        "recsys_eval_composite_score", {"variant": view.variant, "window": window}, view.composite
    )
    if not math.isnan(view.users):
        fam.add("recsys_eval_users", {"variant": view.variant, "window": window}, view.users)


def _experiment(fam: Families, readout: ExperimentReadout) -> None:
    name = readout.name
    _interleaving(fam, readout)
    fam.add("recsys_eval_srm_p_value", {"experiment": name}, readout.srm_p_sequential)
    for variant, n in readout.users.items():
        labels = {"experiment": name, "variant": variant}
        fam.add("recsys_eval_ab_users", labels, float(n))
        fam.add("recsys_eval_ab_requests", labels, readout.requests[variant])
    ready: set[str] = set()
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
        fam.add("recsys_eval_ab_p_value", {**labels, "method": "holm"}, c.p_holm)
        _cuped(fam, labels, readout.cuped, c)
        if c.variant not in ready:
            ready.add(c.variant)
            fam.add(
                "recsys_eval_ab_ready",
                {"experiment": name, "variant": c.variant, "control": c.control},
                float(c.ready),
            )


def _interleaving(fam: Families, readout: ExperimentReadout) -> None:
    for p in readout.interleaving:
        labels = {"experiment": readout.name, "ranker_a": p.first, "ranker_b": p.second}
        for suffix, value in (("", p.preference), ("_lower", p.lower), ("_upper", p.upper)):
            fam.add("recsys_eval_interleaving_preference" + suffix, labels, value)
        for method, value in (("sequential", p.p_sequential), ("fixed", p.p_fixed)):
            fam.add("recsys_eval_interleaving_p_value", {**labels, "method": method}, value)
        for ranker, share in ((p.first, 1.0 - p.share_second), (p.second, p.share_second)):
            fam.add("recsys_eval_interleaving_win_share", {**labels, "ranker": ranker}, share)
        fam.add("recsys_eval_interleaving_requests", labels, p.requests)
        fam.add("recsys_eval_interleaving_ready", labels, float(p.ready))


def _cuped(fam: Families, labels: dict[str, str], cuped: list[Comparison], c: Comparison) -> None:
    """The CUPED-adjusted twin of comparison ``c``, if the readout has one."""
    twin = next(
        (a for a in cuped if (a.variant, a.k, a.adjusted) == (c.variant, c.k, c.adjusted)), None
    )
    if twin is None:
        return
    for suffix, value in (("", twin.diff), ("_lower", twin.lower), ("_upper", twin.upper)):
        fam.add("recsys_eval_ab_cuped_ndcg_diff" + suffix, labels, value)
    for method, p in (("sequential", twin.p_sequential), ("fixed", twin.p_fixed)):
        fam.add("recsys_eval_ab_cuped_p_value", {**labels, "method": method}, p)
    fam.add("recsys_eval_ab_cuped_p_value", {**labels, "method": "holm"}, twin.p_holm)
    fam.add("recsys_eval_ab_cuped_variance_reduction", labels, twin.reduction)


def _propensity(fam: Families, estimates: Mapping[str, Estimate]) -> None:
    for name, e in estimates.items():
        fam.add("recsys_eval_propensity_eta", {"estimator": name}, e.eta)
        for k in range(e.theta.size):
            labels = {"position": str(k + 1), "estimator": name}
            fam.add("recsys_eval_propensity", labels, e.theta[k])
            fam.add("recsys_eval_propensity_lower", labels, e.lower[k])
            fam.add("recsys_eval_propensity_upper", labels, e.upper[k])
            fam.add("recsys_eval_propensity_clicks", labels, e.samples[k])
            fam.add("recsys_eval_propensity_fallback", labels, float(e.fallback[k]))
