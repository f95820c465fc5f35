"""`/healthz` (the process answers and its worker threads run) and `/readyz` (the node daemon serves), for the
DaemonSet's probes, and `/metrics` (Prometheus's text format) when given a registry (and `extra`, text appended
to it: the per-container families).

A plain threaded HTTP server from the standard library: three fixed GET paths need no framework.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Ready = Callable[[], tuple[bool, str]]


class HealthServer:
    """Serves on `port` (0 picks a free one: see .port) until stop()."""

    def __init__(self, port: int, ready: Ready, host: str = "0.0.0.0",
                 registry: CollectorRegistry | None = None, alive: Ready | None = None,
                 extra: Callable[[], bytes] | None = None) -> None:
        self.ready = ready
        self.alive = alive
        self.registry = registry
        outer = self
        paths = "/healthz, /readyz" + (", /metrics" if registry is not None else "")
        self.paths = paths

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                content_type = "text/plain; charset=utf-8"
                if self.path == "/metrics" and outer.registry is not None:
                    try:
                        body = generate_latest(outer.registry) + (extra() if extra is not None else b"")
                        code, content_type = 200, CONTENT_TYPE_LATEST
                    except Exception as exc:  # a scrape must answer; the daemon goes on
                        log.exception("collecting metrics failed")
                        code, body = 500, f"collecting metrics failed: {exc}\n".encode()
                    self._answer(code, body, content_type)
                    return
                if self.path == "/healthz":
                    try:
                        ok, text = outer.alive() if outer.alive is not None else (True, "ok")
                    except Exception as exc:  # noqa: BLE001 - a probe must answer
                        ok, text = False, f"liveness check failed: {exc}"
                    code = 200 if ok else 503
                elif self.path == "/readyz":
                    try:
                        ok, text = outer.ready()
                    except Exception as exc:  # a probe must answer, whatever the daemon's state
                        ok, text = False, f"readiness check failed: {exc}"
                    code = 200 if ok else 503
                else:
                    code, text = 404, f"not found: use {paths}"
                self._answer(code, (text + "\n").encode(), content_type)

            def _answer(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("health endpoints on port %d (%s)", self.port, self.paths, extra={"fields": {"port": self.port}})
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
