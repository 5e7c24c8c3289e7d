"""The built-in live dashboard: a page served next to ``/metrics``, fed by the same
read model (:mod:`evaluator.readout.model`).

Each refresh of the read model behind ``/metrics`` becomes a compact snapshot (nDCG
per variant raw and adjusted, every exported ranking metric of the registry for the
table, A/B differences since each experiment's start with their always-valid bands,
the sequential p-value, users per arm and the sample-ratio test, requests per
variant, the propensity curves, pipeline health), and the page polls
``/api/dashboard`` for the recent snapshots. The page and its script ship in the
package (``evaluator/web``): nothing is loaded from a CDN.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

from prometheus_client.core import Metric

from evaluator.core.ab.readout import ExperimentReadout
from evaluator.core.metrics.registry import REGISTRY
from evaluator.core.regression import Detection
from evaluator.readout.model import ReadModel, WindowView

_SHOWN = [m for m in REGISTRY if m.family is not None]
"""The exported metrics, shown in the per-variant table."""

ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


def _asset(name: str) -> bytes:
    return resources.files("evaluator.adapters.web").joinpath(name).read_bytes()


class DashboardHistory:
    """Recent snapshots of the metrics the page plots, for one window and cutoff."""

    def __init__(
        self,
        window: str,
        k: int,
        keep: int = 720,
        truth: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.window = window
        self.k = str(k)
        self.truth = truth
        self._snapshots: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def record(
        self, model: ReadModel, process: Iterable[Metric] = (), now_s: float | None = None
    ) -> None:
        """Keep the snapshot of one read model (what ``/metrics`` serves, taken as values,
        not parsed back from text) and the process's own metrics."""
        snap = self.snapshot(model, process, time.time() if now_s is None else now_s)
        with self._lock:
            self._snapshots.append(snap)

    def snapshot(self, model: ReadModel, process: Iterable[Metric], now_s: float) -> dict[str, Any]:
        """What the page plots at one moment; non-finite values (no data, inference
        withheld) are left out, which JSON could not carry."""
        snap: dict[str, Any] = {
            "t": round(now_s, 3),
            "ndcg": {},
            "metrics": {},
            "requests": {},
            "ab": {},
            "interleaving": {},
            "propensity": {},
            "eta": {},
            "health": {},
            "regression": {},
        }
        if model.watermark_ms is not None:
            snap["watermark"] = model.watermark_ms / 1000.0
        for window in model.windows:
            if window.label == self.window:
                self._window(snap, window)
        for readout in model.experiments:
            self._experiment(snap, readout)
        for (variant, k), d in model.regression.items():
            if str(k) == self.k:
                snap["regression"][variant] = _regression(d)
        for name, e in model.propensity.items():
            if math.isfinite(e.eta):
                snap["eta"][name] = e.eta
            curve = [float(v) for v in e.theta if math.isfinite(v)]
            if curve:
                snap["propensity"][name] = curve
        health = snap["health"]
        for family in process:
            for sample in family.samples:
                if sample.name in _HEALTH:
                    key = _HEALTH[sample.name]
                    health[key] = health.get(key, 0.0) + sample.value
        return snap

    def _window(self, snap: dict[str, Any], window: WindowView) -> None:
        k = int(self.k)
        for view in window.variants:
            overall = view.cohorts["all"]
            snap["requests"][view.variant] = overall.requests
            for spec in _SHOWN:
                value = overall.means.get((spec.name, k), math.nan)
                if not math.isfinite(value):
                    continue
                snap["metrics"].setdefault(view.variant, {})[spec.name] = value
                if spec.family == "recsys_eval_ndcg":
                    kind = "adjusted" if dict(spec.labels)["adjusted"] == "true" else "raw"
                    snap["ndcg"].setdefault(view.variant, {})[kind] = value

    def _experiment(self, snap: dict[str, Any], readout: ExperimentReadout) -> None:
        """The experiment-scoped A/B values (cumulative: no window)."""
        if math.isfinite(readout.srm_p_sequential):
            snap.setdefault("srm", {})[readout.name] = readout.srm_p_sequential
        if readout.users:
            users = snap.setdefault("users", {}).setdefault(readout.name, {})
            users.update({variant: float(n) for variant, n in readout.users.items()})
        for c in readout.comparisons:
            if c.k != int(self.k) or c.adjusted != "false":
                continue
            key = f"{readout.name}: {c.variant} - {c.control}"
            parts = {"diff": c.diff, "lower": c.lower, "upper": c.upper, "p": c.p_holm}
            twin = next(
                (
                    a
                    for a in readout.cuped
                    if (a.variant, a.k, a.adjusted) == (c.variant, c.k, c.adjusted)
                ),
                None,
            )
            if twin is not None:  # the CUPED-adjusted band beside it
                parts |= {
                    "cuped_diff": twin.diff,
                    "cuped_lower": twin.lower,
                    "cuped_upper": twin.upper,
                    "cuped_reduction": twin.reduction,
                }
            for part, value in parts.items():
                if math.isfinite(value):
                    snap["ab"].setdefault(key, {})[part] = value
        for pair in readout.interleaving:  # the preference for the second ranker
            key = f"{readout.name}: {pair.second} over {pair.first}"
            found = {
                "diff": pair.preference,
                "lower": pair.lower,
                "upper": pair.upper,
                "p": pair.p_sequential,
                "share": pair.share_second,
            }
            snap["interleaving"][key] = {k: v for k, v in found.items() if math.isfinite(v)}

    def json(self) -> bytes:
        with self._lock:
            snapshots = list(self._snapshots)
        body: dict[str, Any] = {
            "window": self.window,
            "k": self.k,
            "metrics": [{"name": m.name, "label": m.label} for m in REGISTRY if m.family],
            "snapshots": snapshots,
        }
        if self.truth is not None:
            body["truth"] = self.truth()
        return json.dumps(body).encode()


def _regression(d: Detection) -> dict[str, Any]:
    """What the page shows of a variant's regression detector and provisional nDCG."""
    out: dict[str, Any] = {"armed": d.armed, "flag": d.regression, "score": d.score}
    if d.since_ms is not None and d.regression:
        out["since"] = d.since_ms / 1000.0
    if d.provisional is not None and d.band is not None:
        out |= {"provisional": d.provisional, "band": d.band}
    return out


_HEALTH = {
    "recsys_eval_events_consumed_total": "consumed",
    "recsys_eval_invalid_events_total": "invalid",
    "recsys_eval_finalised_requests_total": "finalised",
    "recsys_eval_late_events_total": "late",
    "recsys_eval_duplicate_events_total": "duplicates",
    "recsys_eval_consumer_lag_messages": "lag",
    "recsys_eval_watermark_delay_seconds": "watermark_delay_s",
    "recsys_eval_redis_errors_total": "store_errors",
}


def routes(history: DashboardHistory) -> dict[str, Callable[[], tuple[bytes, str]]]:
    """Paths served by the HTTP server for the dashboard."""

    def asset(name: str, ctype: str) -> Callable[[], tuple[bytes, str]]:
        return lambda: (_asset(name), ctype)

    out = {path: asset(name, ctype) for path, (name, ctype) in ASSETS.items()}
    out["/api/dashboard"] = lambda: (history.json(), "application/json")
    return out
