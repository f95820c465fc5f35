"""`/healthz` (the process answers) and `/readyz` (the node daemon serves), for the DaemonSet's probes.

A plain threaded HTTP server from the standard library: two fixed GET paths need no framework.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

Ready = Callable[[], tuple[bool, str]]


class HealthServer:
    """Serves on `port` (0 picks a free one: see .port) until stop()."""

    def __init__(self, port: int, ready: Ready, host: str = "0.0.0.0") -> None:
        self.ready = ready
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/healthz":
                    code, text = 200, "ok"
                elif self.path == "/readyz":
                    try:
                        ok, text = outer.ready()
                    except Exception as exc:  # a probe must answer, whatever the daemon's state
                        ok, text = False, f"readiness check failed: {exc}"
                    code = 200 if ok else 503
                else:
                    code, text = 404, "not found: use /healthz or /readyz"
                body = (text + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
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
        log.info("health endpoints on port %d (/healthz, /readyz)", self.port, extra={"fields": {"port": self.port}})
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
