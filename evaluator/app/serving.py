"""HTTP wiring shared by ``evaluator run`` and ``evaluator demo``: /metrics, health, dashboard."""

from __future__ import annotations

import logging
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry

from evaluator.adapters.prometheus.collector import WindowCollector
from evaluator.adapters.prometheus.pipeline import PipelineCollector
from evaluator.adapters.web.dashboard import DashboardHistory, routes
from evaluator.adapters.web.http import Refreshed, serve
from evaluator.config import Settings
from evaluator.config.plain import readout_config
from evaluator.core.timeutil import parse_duration_ms
from evaluator.engine.batches import wall_clock_ms
from evaluator.engine.ports import StateStore
from evaluator.engine.tasks import Tasks
from evaluator.readout.live import LiveReader
from evaluator.readout.model import ReadModel

log = logging.getLogger(__name__)


def serve_metrics(
    settings: Settings,
    store: StateStore,
    tasks: Tasks,
    *,
    alive: Callable[[], bool],
    ready: Callable[[], tuple[bool, str]],
    lag: Callable[[], dict[str, int]] = dict,
    truth: Callable[[], dict[str, Any]] | None = None,
) -> ThreadingHTTPServer | None:
    """Serve /metrics (refreshed in the background), /healthz, /readyz and the dashboard
    page; ``truth`` adds the simulator's ground truth to the dashboard data."""
    if not settings.http.port:
        return None
    registry = CollectorRegistry()
    pipeline = PipelineCollector(tasks.stats, lag, tasks.watermark, wall_clock_ms)
    registry.register(pipeline)
    windows = WindowCollector(LiveReader(store, readout_config(settings), store.frontier))
    history = DashboardHistory(settings.windows.sizes_label(), settings.metrics.k[0], truth=truth)
    refresh_s = parse_duration_ms(settings.http.refresh_interval) / 1000.0

    def record(model: ReadModel) -> None:  # the dashboard reads the values, not the text
        history.record(model, pipeline.collect())

    if refresh_s:
        windows.attach(Refreshed(windows.read, refresh_s, on_refresh=record).get)
    else:  # computed at every scrape

        def fresh() -> ReadModel:
            model = windows.read()
            record(model)
            return model

        windows.attach(fresh)
    registry.register(windows)
    server = serve(
        registry,
        settings.http.host,
        settings.http.port,
        alive=alive,
        ready=ready,
        routes=routes(history),
    )
    host, port = server.server_address[:2]
    log.info("serving /metrics, /healthz, /readyz and the dashboard on %s:%d", host, port)
    return server
