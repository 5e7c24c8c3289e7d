"""The gauge families of the window metrics: names, help and labels of each sample."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

from evaluator.core.metrics.registry import REGISTRY
from evaluator.readout.model import WITH_STDERR


@dataclass(slots=True)
class Families:
    """The gauge samples of one scrape, keyed by metric name."""

    help: dict[str, str]
    labels: dict[str, list[str]]
    samples: dict[str, list[tuple[list[str], float]]]

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        """Add a sample; NaN (no data yet) is left out rather than exported."""
        if math.isfinite(value):
            self.samples[name].append(([labels[k] for k in self.labels[name]], float(value)))

    def families(self) -> Iterator[GaugeMetricFamily]:
        """The families with samples (an empty one would only add HELP and TYPE lines)."""
        for name, samples in self.samples.items():
            if not samples:
                continue
            family = GaugeMetricFamily(name, self.help[name], labels=self.labels[name])
            for values, value in samples:
                family.add_metric(values, value)
            yield family


Spec = dict[str, tuple[str, list[str]]]


def _bounded(
    spec: Spec,
    name: str,
    text: str,
    of: str,
    labels: list[str],
    *,
    kind: str = "always-valid bound (1 - ab.alpha)",
) -> None:
    """A value's family and its bounds' (``_lower``, ``_upper``; always-valid unless
    ``kind`` says otherwise)."""
    spec[name] = (text, labels)
    for side in ("lower", "upper"):
        spec[f"{name}_{side}"] = (f"{side.capitalize()} {kind} of {of}.", labels)


def _regression(spec: Spec) -> None:
    """The regression detector's families (docs/statistics.md, "Regression detection")."""
    vk = ["variant", "k"]
    spec["recsys_eval_regression"] = (
        "1 while nDCG@K of the variant is in regression against its seasonal baseline "
        "(a CUSUM over slots, under regression.false_alarms_per_30d); alert on this.",
        vk,
    )
    spec["recsys_eval_regression_score"] = (
        "The regression CUSUM over its threshold (>= 1: in regression; 0: no evidence).",
        vk,
    )
    spec["recsys_eval_regression_since_timestamp_seconds"] = (
        "Where the current excursion of the regression CUSUM began (Unix seconds of "
        "finalisation time; absent while the score is 0).",
        vk,
    )
    spec["recsys_eval_regression_armed"] = (
        "1 when the detector has a baseline (a week of history) and a full last slot.",
        vk,
    )
    spec["recsys_eval_regression_slot_ndcg"] = (
        "Mean nDCG@K of the last complete slot the detector compared.",
        vk,
    )
    spec["recsys_eval_regression_baseline_ndcg"] = (
        "Its seasonal baseline: the same time of week over the last regression.baseline_weeks.",
        vk,
    )
    _bounded(
        spec,
        "recsys_eval_provisional_ndcg",
        "Estimated final mean nDCG@K of the latest requests still inside their attribution "
        "window: their nDCG at the provisional age over the maturity (one slot).",
        "the provisional nDCG",
        vk,
        kind="bound of the 95% prediction band",
    )
    spec["recsys_eval_provisional_maturity"] = (
        "Share of the final mean nDCG@K that has arrived by the age (learnt from the last "
        "regression.span of requests that are now final): the maturity curve at that age.",
        [*vk, "age"],
    )
    spec["recsys_eval_ndcg_maturity"] = (
        "The maturity curve: share of the final nDCG@K that the interactions of the first "
        "`age` after the impression give, over the requests finalised in the UTC days "
        "that overlap the last regression.span (regression.maturity_ages).",
        [*vk, "age"],
    )
    spec["recsys_eval_provisional_partial_ndcg"] = (
        "Mean nDCG@K of the latest provisional slot with the interactions seen by the age.",
        [*vk, "age"],
    )


def new_families() -> Families:
    spec = {
        "recsys_eval_requests": (
            "Requests finalised in the window.",
            ["variant", "window", "cohort"],
        ),
        "recsys_eval_users": (
            "Distinct users with a finalised request in the window (a HyperLogLog "
            "estimate, about 0.8% standard error): the unit of the standard errors.",
            ["variant", "window"],
        ),
        "recsys_eval_engaged_requests": (
            "Finalised requests with a relevant item.",
            ["variant", "window", "cohort"],
        ),
        "recsys_eval_coverage": (
            "Share of the catalog in the top K of the variant's lists in the window.",
            ["variant", "k", "window"],
        ),
        "recsys_eval_ab_overlap": (
            "Overlap with the control: Jaccard@K of the recommended item sets in the window "
            '(measure="jaccard"), or mean rank-biased overlap with shadow rankings '
            '(measure="rbo", k="all").',
            ["experiment", "variant", "control", "k", "window", "measure"],
        ),
        "recsys_eval_diversity": (
            "Mean intra-list diversity@K of lists with the attribute, in the window.",
            ["variant", "k", "window"],
        ),
        "recsys_eval_composite_score": (
            "Configured weighted sum of metrics (per-request terms).",
            ["variant", "window"],
        ),
        "recsys_eval_watermark_seconds": ("Event-time watermark (Unix seconds).", []),
        "recsys_eval_open_requests": ("Requests stored and not yet finalised (all instances).", []),
        "recsys_eval_due_requests": (
            "Open requests the watermark has passed, waiting for finalisation; growing: "
            "finalisation is falling behind.",
            [],
        ),
        "recsys_eval_srm_p_value": (
            "Always-valid sample-ratio-mismatch p-value (Dirichlet-multinomial Bayes "
            "factor) of the users exposed per variant since the experiment's start: safe "
            "to alert on continuously.",
            ["experiment"],
        ),
        "recsys_eval_ab_users": (
            "Distinct users exposed to the variant since the experiment's start (exact).",
            ["experiment", "variant"],
        ),
        "recsys_eval_ab_requests": (
            "Finalised requests of the variant since the experiment's start.",
            ["experiment", "variant"],
        ),
        "recsys_eval_ab_ready": (
            "1 when the comparison with the control is trustworthy enough to show an "
            "interval and p-values (enough users, variance not dominated by heavy users).",
            ["experiment", "variant", "control"],
        ),
        "recsys_eval_propensity": (
            "Estimated examination propensity theta_k / theta_1 (all data so far).",
            ["position", "estimator"],
        ),
        "recsys_eval_propensity_lower": (
            "Lower approximate 95% bound of the propensity (absent where it falls back).",
            ["position", "estimator"],
        ),
        "recsys_eval_propensity_upper": (
            "Upper approximate 95% bound of the propensity.",
            ["position", "estimator"],
        ),
        "recsys_eval_propensity_clicks": (
            "Clicks behind the propensity estimate at the position.",
            ["position", "estimator"],
        ),
        "recsys_eval_propensity_fallback": (
            "1 when the position uses the fitted power law for lack of clicks.",
            ["position", "estimator"],
        ),
        "recsys_eval_propensity_eta": (
            "Power-law exponent fitted to the estimate: theta_k = k ** -eta.",
            ["estimator"],
        ),
    }
    ab = ["experiment", "variant", "control", "k", "adjusted"]
    for suffix, text in (
        ("", "Variant minus control, mean nDCG@K since the experiment's start."),
        ("_lower", "Lower always-valid bound (1 - ab.alpha) of the difference."),
        ("_upper", "Upper always-valid bound (1 - ab.alpha) of the difference."),
    ):
        spec["recsys_eval_ab_ndcg_diff" + suffix] = (text, ab)
        spec["recsys_eval_ab_ndcg_lift" + suffix] = (
            text.replace("Variant minus control", "Relative lift (variant / control - 1)").replace(
                "of the difference", "of the relative lift (Fieller)"
            ),
            ab,
        )
    spec["recsys_eval_ab_p_value"] = (
        "p-value of variant vs control since the experiment's start (method: sequential "
        "is always valid; holm is the sequential one adjusted for the experiment's arms, "
        "the one to watch with several; fixed is valid for a single look only).",
        [*ab, "method"],
    )
    _bounded(
        spec,
        "recsys_eval_ab_cuped_ndcg_diff",
        "Variant minus control, mean nDCG@K since the experiment's start, adjusted "
        "by the users' pre-exposure activity (CUPED): the same effect, less noise.",
        "the CUPED-adjusted difference",
        ab,
    )
    spec["recsys_eval_ab_cuped_p_value"] = (
        "p-value of the CUPED-adjusted difference (methods as recsys_eval_ab_p_value).",
        [*ab, "method"],
    )
    spec["recsys_eval_ab_cuped_variance_reduction"] = (
        "Share of the difference's variance that CUPED removed (1 - adjusted / unadjusted "
        "variance; the users needed for the same interval shrink by as much).",
        ab,
    )
    pair = ["experiment", "ranker_a", "ranker_b"]
    _bounded(
        spec,
        "recsys_eval_interleaving_preference",
        "Team-draft interleaving since the experiment's start: preference for ranker_b "
        "over ranker_a, (wins - losses) / informative requests, in [-1, 1].",
        "the interleaving preference",
        pair,
    )
    spec["recsys_eval_interleaving_p_value"] = (
        "p-value of the interleaving preference against none (method: sequential is "
        "always valid; fixed is valid for a single look only).",
        [*pair, "method"],
    )
    spec["recsys_eval_interleaving_win_share"] = (
        "Share of the decided (not tied) interleaved requests the ranker won.",
        [*pair, "ranker"],
    )
    spec["recsys_eval_interleaving_requests"] = (
        "Interleaved requests with a relevant interaction credited to a ranker, since "
        "the experiment's start.",
        pair,
    )
    spec["recsys_eval_interleaving_ready"] = (
        "1 when the interleaving preference has enough user buckets to show an interval.",
        pair,
    )
    _regression(spec)
    for metric in REGISTRY:  # the ranking metrics' window means
        if metric.family is not None:
            labels = ["variant", "k", "window", *(name for name, _ in metric.labels), "cohort"]
            spec.setdefault(metric.family, (metric.help, labels))
            if metric.name in WITH_STDERR:
                spec.setdefault(
                    metric.family + "_stderr",
                    (
                        f"Standard error of {metric.family} (delta method, the user bucket "
                        "as the unit): for z-tests of a window against a baseline.",
                        labels,
                    ),
                )
    return Families(
        {n: d for n, (d, _) in spec.items()},
        {n: lab for n, (_, lab) in spec.items()},
        {n: [] for n in spec},
    )
