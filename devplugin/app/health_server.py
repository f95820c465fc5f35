"""`/healthz` (the process answers and its worker threads run) and `/readyz` (the node component serves), for the
DaemonSet's probes. The kubelet probes the pod's IP, so this port listens on every address; it serves the probes
and nothing else (the figures are on the metrics port: devplugin/app/metrics_server.py).

Served by uvicorn with the bounds of devplugin/app/http_serving.py: a pod that opens connections and never
finishes its requests holds no thread and a bounded amount of memory.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from devplugin.app.http_serving import DEFAULT_BOUNDS, BoundedServer, Bounds

Ready = Callable[[], tuple[bool, str]]
PROBE_PATHS = "/healthz, /readyz"


def _answer(check: Ready, what: str) -> PlainTextResponse:
    try:
        ok, text = check()
    except Exception as exc:  # noqa: BLE001 - a probe must answer, whatever the daemon's state
        ok, text = False, f"{what} check failed: {exc}"
    return PlainTextResponse(text + "\n", status_code=200 if ok else 503)


def probe_app(ready: Ready, alive: Ready | None = None, metrics_port: int = 0) -> Starlette:
    """The probes' routes; any other path gets 404 naming what is served here (and where /metrics is)."""
    def always() -> tuple[bool, str]:
        return True, "ok"

    async def healthz(_: Request) -> PlainTextResponse:
        return _answer(alive or always, "liveness")

    async def readyz(_: Request) -> PlainTextResponse:
        return _answer(ready, "readiness")

    where = f"port {metrics_port}" if metrics_port else "off: set --metrics-port"

    async def not_found(request: Request, _: Exception) -> PlainTextResponse:
        return PlainTextResponse(f"not found: use {PROBE_PATHS}; /metrics is on the metrics port ({where})\n",
                                 status_code=404)

    return Starlette(routes=[Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])],
                     exception_handlers={404: not_found})


def health_server(port: int, ready: Ready, alive: Ready | None = None, host: str = "0.0.0.0",
                  metrics_port: int = 0, bounds: Bounds = DEFAULT_BOUNDS) -> BoundedServer:
    """The probes on host:port (port 0 picks a free one: see .port), not started yet."""
    return BoundedServer(probe_app(ready, alive, metrics_port), host, port, "health", bounds)
