"""`/metrics` of the node components, on a port of its own (`--metrics-port`), apart from the probes' port: the
node daemon's figures name every tenant's namespaces, pods and containers and their GPU use, so they go only to
the scraper the operator allows. The port listens on `--metrics-address`, loopback unless told otherwise; with
`--metrics-auth kubernetes` each scrape must carry a bearer token the apiserver authenticates and allows `get` on
/metrics (devplugin/app/metrics_auth.py). Served by uvicorn with the bounds of devplugin/app/http_serving.py; the
reviews and the collection run on at most two worker threads.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from devplugin.app.http_serving import DEFAULT_BOUNDS, BoundedServer, Bounds
from devplugin.app.metrics_auth import (
    FORWARDED_TOKEN_HEADER,
    METRICS_PATH,
    ApiserverError,
    TokenCheck,
    User,
    bearer_token,
    kube_reviews,
)

log = logging.getLogger(__name__)

WORKER_THREADS = 2
UNAUTHORIZED = ("send a bearer token of a user allowed to get /metrics (Authorization: Bearer <token>; the "
                "PodMonitor's authorization, or Prometheus's bearer_token_file; through the apiserver's pod proxy, "
                f"which drops Authorization: {FORWARDED_TOKEN_HEADER}: <token>)")


def metrics_app(render: Callable[[], bytes], check: TokenCheck | None = None) -> Starlette:
    """GET /metrics: `render()` (Prometheus's text format); with `check`, only for an allowed bearer token."""
    from anyio import CapacityLimiter, to_thread

    workers: list[CapacityLimiter] = []

    async def in_worker(fn: Callable[..., Any], *args: Any) -> Any:
        if not workers:
            workers.append(CapacityLimiter(WORKER_THREADS))
        return await to_thread.run_sync(fn, *args, limiter=workers[0])

    async def metrics(request: Request) -> Response:
        if check is not None:
            token = bearer_token(request.headers.get("authorization", ""),
                                 request.headers.get(FORWARDED_TOKEN_HEADER, ""))
            verdict = await in_worker(check.verdict, token) if token else None
            if verdict is None or verdict.status != 200:
                status = 401 if verdict is None else verdict.status
                reason = UNAUTHORIZED if verdict is None else verdict.reason
                headers = {"WWW-Authenticate": 'Bearer realm="gpushare-metrics"'} if status == 401 else None
                return PlainTextResponse(f"{reason}\n", status_code=status, headers=headers)
        try:
            body = await in_worker(render)
        except Exception as exc:  # noqa: BLE001 - a scrape must answer; the daemon goes on
            log.exception("collecting metrics failed")
            return PlainTextResponse(f"collecting metrics failed: {exc}\n", status_code=500)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, _: Exception) -> PlainTextResponse:
        return PlainTextResponse(f"not found: use {METRICS_PATH}\n", status_code=404)

    return Starlette(routes=[Route(METRICS_PATH, metrics, methods=["GET"])], exception_handlers={404: not_found})


def metrics_server(host: str, port: int, render: Callable[[], bytes], check: TokenCheck | None = None,
                   bounds: Bounds = DEFAULT_BOUNDS) -> BoundedServer:
    """/metrics on host:port (port 0 picks a free one: see .port), not started yet."""
    return BoundedServer(metrics_app(render, check), host, port, "metrics", bounds)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def token_check(kubeconfig: str) -> TokenCheck:
    """The reviews through the component's own apiserver credentials. Without any, every scrape gets 503 saying
    why (the node component itself goes on serving its GPUs)."""
    from devplugin.kube.client import KubeConfigError, load_api_client

    try:
        return TokenCheck(*kube_reviews(load_api_client(kubeconfig)))
    except KubeConfigError as exc:
        log.error("--metrics-auth kubernetes: %s; every scrape will be refused (503) until the daemon can reach the "
                  "apiserver", exc)
        problem = str(exc)

        def cannot(_: object) -> User | None:
            raise ApiserverError(problem)

        return TokenCheck(cannot, lambda user: (False, problem))


def start_metrics(port: int, address: str, auth: str, kubeconfig: str, render: Callable[[], bytes],
                  what: str) -> BoundedServer | None:
    """Serve /metrics per the component's flags (`what` names what the figures reveal, for the warning when they
    are open to every address); None when --metrics-port is 0."""
    if not port:
        return None
    check = token_check(kubeconfig) if auth == "kubernetes" else None
    if check is None and not is_loopback(address):
        log.warning("%s are served to anyone who reaches %s:%d, without authentication: set --metrics-auth "
                    "kubernetes (a bearer token allowed get /metrics), or keep --metrics-address 127.0.0.1",
                    what, address, port, extra={"fields": {"address": address, "port": port}})
    server = metrics_server(address, port, render, check).start()
    log.info("metrics on %s:%d%s", address, port, " (bearer tokens reviewed by the apiserver)" if check else "",
             extra={"fields": {"address": address, "port": server.port, "auth": auth}})
    return server
