"""A node component's two HTTP listeners, started together from its settings: the probes on `--health-port`
(every address: the kubelet probes the pod's IP) and /metrics on `--metrics-port` (`--metrics-address`,
`--metrics-auth`). Both are bounded (devplugin/app/http_serving.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from devplugin.app.health_server import Ready, health_server
from devplugin.app.http_serving import BoundedServer
from devplugin.app.metrics_server import start_metrics

log = logging.getLogger(__name__)


class EndpointSettings(Protocol):
    health_port: int
    metrics_port: int
    metrics_address: str
    metrics_auth: str
    kubeconfig: str


def start_endpoints(cfg: EndpointSettings, ready: Ready, alive: Ready | None, render: Callable[[], bytes],
                    what: str) -> list[BoundedServer]:
    """Start the listeners the settings ask for; OSError or RuntimeError (naming the address) when one cannot
    listen, with the others stopped again."""
    # uvicorn's own start and stop lines name no listener: the lines below say what listens where
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    servers: list[BoundedServer] = []
    try:
        if cfg.health_port:
            servers.append(health_server(cfg.health_port, ready, alive, metrics_port=cfg.metrics_port).start())
            log.info("probes on port %d (/healthz, /readyz)", cfg.health_port,
                     extra={"fields": {"port": cfg.health_port}})
        metrics = start_metrics(cfg.metrics_port, cfg.metrics_address, cfg.metrics_auth, cfg.kubeconfig, render, what)
        if metrics is not None:
            servers.append(metrics)
    except BaseException:
        stop_endpoints(servers)
        raise
    return servers


def stop_endpoints(servers: list[BoundedServer]) -> None:
    for server in servers:
        server.stop()
