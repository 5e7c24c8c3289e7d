"""HTTP endpoints: ``/metrics`` (Prometheus), ``/healthz`` (alive) and ``/readyz`` (ready)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    alive: Callable[[], bool],
    ready: Callable[[], tuple[bool, str]],
    extra: Callable[[], bytes] = lambda: b"",
) -> ThreadingHTTPServer:
    """Start the endpoints on a daemon thread; returns the server (``server_address`` has
    the bound port when ``port`` is 0). ``/metrics`` is the registry's exposition
    followed by ``extra()`` (more exposition text, e.g. the window metrics)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(registry) + extra(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = alive()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"stalled\n")
            elif path == "/readyz":
                ok, why = ready()
                self._reply(200 if ok else 503, (why + "\n").encode())
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
