"""The built-in live dashboard: a page served next to ``/metrics``, fed by the same series.

Each refresh of the readout behind ``/metrics`` becomes a compact snapshot (nDCG
per variant raw and adjusted, every exported ranking metric of the registry for the
table, A/B differences since each experiment's start
with their always-valid bands, the sequential p-value, users per arm and the
sample-ratio test, requests per variant, the propensity curves, pipeline health), and the page
polls ``/api/dashboard`` for the recent snapshots. The page and its script ship
in the package (``evaluator/web``): nothing is loaded from a CDN.
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

from evaluator.adapters.prometheus.families import Families
from evaluator.core.metrics.registry import REGISTRY

_TABLE = {(m.family, m.labels): m.name for m in REGISTRY if m.family is not None}
"""(family, constant labels) -> metric, for the per-variant table."""

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
        self, readout: Families, process: Iterable[Metric] = (), now_s: float | None = None
    ) -> None:
        """Keep the snapshot of one readout (the values ``/metrics`` serves, taken as
        values, not parsed back from text) and the process's own metrics."""
        samples = [
            (name, dict(zip(readout.labels[name], values, strict=True)), value)
            for name, rows in readout.samples.items()
            for values, value in rows
        ]
        samples += [(s.name, s.labels, s.value) for family in process for s in family.samples]
        snap = self.snapshot(samples, time.time() if now_s is None else now_s)
        with self._lock:
            self._snapshots.append(snap)

    def snapshot(
        self, samples: Iterable[tuple[str, dict[str, str], float]], now_s: float
    ) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "t": round(now_s, 3),
            "ndcg": {},
            "metrics": {},
            "requests": {},
            "ab": {},
            "propensity": {},
            "eta": {},
            "health": {},
        }
        for name, labels, value in samples:
            self._take(snap, name, labels, value)
        snap["propensity"] = {
            est: [curve[k] for k in sorted(curve)] for est, curve in snap["propensity"].items()
        }
        return snap

    def _take(self, snap: dict[str, Any], name: str, labels: dict[str, str], value: float) -> None:
        in_view = labels.get("window") == self.window and labels.get("k", self.k) == self.k
        shown = in_view and labels.get("cohort") == "all"
        metric = _TABLE.get((name, tuple((k, v) for k, v in labels.items() if k not in _VIEW)))
        if metric is not None and shown:
            snap["metrics"].setdefault(labels["variant"], {})[metric] = value
        if name == "recsys_eval_ndcg" and shown:
            kind = "adjusted" if labels["adjusted"] == "true" else "raw"
            snap["ndcg"].setdefault(labels["variant"], {})[kind] = value
        elif name == "recsys_eval_requests" and in_view and labels.get("cohort") == "all":
            snap["requests"][labels["variant"]] = value
        elif name.startswith("recsys_eval_ab_"):
            self._take_ab(snap, name, labels, value)
        elif name == "recsys_eval_watermark_seconds":
            snap["watermark"] = value
        elif name == "recsys_eval_srm_p_value" and math.isfinite(value):
            snap.setdefault("srm", {})[labels["experiment"]] = value
        elif name == "recsys_eval_propensity":
            curve = snap["propensity"].setdefault(labels["estimator"], {})
            curve[int(labels["position"])] = value
        elif name == "recsys_eval_propensity_eta":
            snap["eta"][labels["estimator"]] = value
        elif name in _HEALTH:
            health = snap["health"]
            health[_HEALTH[name]] = health.get(_HEALTH[name], 0.0) + value

    def _take_ab(
        self, snap: dict[str, Any], name: str, labels: dict[str, str], value: float
    ) -> None:
        """The experiment-scoped A/B series (cumulative: no window label); non-finite
        values (inference withheld) are left out, which JSON could not carry."""
        if not math.isfinite(value):
            return
        if name == "recsys_eval_ab_users":
            users = snap.setdefault("users", {}).setdefault(labels["experiment"], {})
            users[labels["variant"]] = value
            return
        compared = name.startswith("recsys_eval_ab_ndcg_diff") or name == "recsys_eval_ab_p_value"
        if not compared or labels["k"] != self.k or labels["adjusted"] != "false":
            return
        key = f"{labels['experiment']}: {labels['variant']} - {labels['control']}"
        if name.startswith("recsys_eval_ab_ndcg_diff"):
            part = name.removeprefix("recsys_eval_ab_ndcg_diff").lstrip("_") or "diff"
            snap["ab"].setdefault(key, {})[part] = value
        elif name == "recsys_eval_ab_p_value" and labels.get("method") == "sequential":
            snap["ab"].setdefault(key, {})["p"] = value

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


_VIEW = {"variant", "k", "window", "cohort"}
"""Labels every ranking-metric series has; the rest tell metrics of a family apart."""

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
