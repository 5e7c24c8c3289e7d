"""HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz`` (alive) and ``/readyz`` (ready)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Generic, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)
T = TypeVar("T")


def serve(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    alive: Callable[[], bool],
    ready: Callable[[], tuple[bool, str]],
    routes: Mapping[str, Callable[[], tuple[bytes, str]]] | None = None,
) -> ThreadingHTTPServer:
    """Start the endpoints on a daemon thread; returns the server (``server_address`` has
    the bound port when ``port`` is 0). ``/metrics`` is the registry's exposition;
    ``routes`` maps more paths to ``(body, content type)`` producers (the dashboard)."""
    pages = dict(routes or {})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = alive()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"stalled\n")
            elif path == "/readyz":
                ok, why = ready()
                self._reply(200 if ok else 503, (why + "\n").encode())
            elif path in pages:
                self._reply(200, *pages[path]())
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


class Refreshed(Generic[T]):
    """A value recomputed on a background thread every ``interval_s`` seconds.

    Reading the window metrics costs tens of milliseconds (Redis reads, A/B
    statistics); serving a copy at most ``interval_s`` old keeps ``/metrics``
    fast however often it is scraped. The first call computes synchronously.
    """

    def __init__(
        self,
        compute: Callable[[], T],
        interval_s: float,
        on_refresh: Callable[[T], object] = lambda value: None,
    ) -> None:
        self.compute = compute
        self.on_refresh = on_refresh
        """Called with each fresh value (the dashboard's history records it)."""
        self.interval_s = interval_s
        self.last_seconds = 0.0
        """How long the latest refresh took (exported by the caller if wanted)."""
        self._value: T | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._loop, name="metrics-refresh", daemon=True).start()

    def _refresh(self) -> T:
        started = time.perf_counter()
        value = self.compute()
        self.last_seconds = time.perf_counter() - started
        with self._lock:
            self._value = value
        self.on_refresh(value)
        return value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._refresh()
            except Exception:  # a failed refresh keeps serving the previous value
                log.exception("refreshing window metrics failed")

    def get(self) -> T:
        with self._lock:
            value = self._value
        return value if value is not None else self._refresh()

    def close(self) -> None:
        self._stop.set()
