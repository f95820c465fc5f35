"""What each container uses, from the node daemons: their /metrics (the gpushare_container_* series), reached
through the apiserver's pod proxy, so inspect needs no route to the nodes and no endpoint of its own on them.

The daemons answer /metrics only to a token allowed `get` on it (docs/reference/metrics.md). The pod proxy drops the
Authorization header once it has authenticated inspect's user, so inspect asks for a 10-minute token of the
ServiceAccount gpushare-metrics-reader in the daemons' namespace (TokenRequest) and sends it in
X-Forwarded-Access-Token, which the proxy passes on.

Why /metrics and not an endpoint of its own: the figures are the ones Prometheus and the dashboard show, the
daemon serves nothing more to anyone, and parsing a node's exposition (a few hundred series) takes milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from devplugin.app.metrics_auth import FORWARDED_TOKEN_HEADER, READER_ACCOUNT

DAEMON_LABEL = "app=gpushare-devplugin"  # the DaemonSet's pod label (deploy/base, the Helm chart)
METRICS_PORT_NAME = "metrics"
TOKEN_SECONDS = 600  # the shortest a TokenRequest may ask
_FIELDS = {
    "gpushare_container_memory_used_bytes": "memory_used",
    "gpushare_container_memory_limit_bytes": "memory_limit",
    "gpushare_container_compute_used_percent": "compute_used",
    "gpushare_container_compute_share_percent": "compute_share",
    "gpushare_container_memory_refusals_total": "refused",
    "gpushare_container_throttled_seconds_total": "throttled_s",
    "gpushare_container_processes": "processes",
}


@dataclass
class ContainerUse:
    """One container on one GPU, as its node daemon reports it."""

    namespace: str
    pod: str
    container: str
    uuid: str
    memory_used: float = 0.0  # bytes
    memory_limit: float = 0.0
    compute_used: float | None = None  # percent of the GPU at the last measurement (None: not measured)
    compute_share: float = 100.0
    refused: float = 0.0
    throttled_s: float = 0.0
    processes: float = 0.0


@dataclass
class NodeUse:
    """A node's containers, or why they could not be read."""

    containers: list[ContainerUse] = field(default_factory=list)
    error: str = ""

    def by_container(self) -> dict[tuple[str, str, str, str], ContainerUse]:
        """(namespace, pod, container, GPU UUID lower case) -> figures."""
        return {(c.namespace, c.pod, c.container, c.uuid.lower()): c for c in self.containers}


def parse_metrics(text: str) -> list[ContainerUse]:
    """The per-container figures of a node daemon's /metrics exposition; ValueError when it does not parse."""
    rows: dict[tuple[str, str, str, str], ContainerUse] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            attr = _FIELDS.get(sample.name)
            if attr is None:
                continue
            lab = sample.labels
            key = (lab.get("namespace", ""), lab.get("pod", ""), lab.get("container", ""), lab.get("uuid", ""))
            row = rows.setdefault(key, ContainerUse(*key))
            setattr(row, attr, float(sample.value))
    return list(rows.values())


def daemon_pods(pods: Iterable[Mapping]) -> dict[str, tuple[str, str, int]]:
    """node name -> (namespace, pod name, metrics port) of a running node daemon on it."""
    out: dict[str, tuple[str, str, int]] = {}
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName")
        if not node or status.get("phase") != "Running":
            continue
        for container in spec.get("containers") or []:
            for port in container.get("ports") or []:
                if port.get("name") == METRICS_PORT_NAME and isinstance(port.get("containerPort"), int):
                    out[node] = (str(meta.get("namespace", "")), str(meta.get("name", "")), port["containerPort"])
    return out


def reader_token(core: Any, namespace: str, timeout_s: float) -> str:
    """A token of gpushare-metrics-reader in `namespace` (TokenRequest); ValueError saying why there is none."""
    from kubernetes.client.rest import ApiException

    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_SECONDS}}
    try:
        resp = core.create_namespaced_service_account_token(READER_ACCOUNT, namespace, body, _preload_content=False,
                                                            _request_timeout=timeout_s)
        token = (json.loads(resp.data).get("status") or {}).get("token")
    except ApiException as exc:
        hint = {403: f" (inspect needs create on serviceaccounts/token of {READER_ACCOUNT} there)",
                404: f" (no ServiceAccount {READER_ACCOUNT} there: apply deploy/base or the chart again)"}
        raise ValueError(f"cannot get a token of {namespace}/{READER_ACCOUNT} to read the daemons' /metrics: "
                         f"{exc.status} {exc.reason}{hint.get(exc.status or 0, '')}") from None
    if not isinstance(token, str) or not token:
        raise ValueError(f"the TokenRequest for {namespace}/{READER_ACCOUNT} returned no token")
    return token


def read_use(api_client: Any, nodes: Iterable[str], timeout_s: float = 10.0) -> dict[str, NodeUse]:
    """Each node's per-container use from its daemon, through the apiserver's pod proxy (get pods/proxy on the
    daemon's namespace, and create serviceaccounts/token of gpushare-metrics-reader there). A node whose daemon
    cannot be reached gets NodeUse.error saying why."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core: Any = client.CoreV1Api(api_client)
    wanted = list(nodes)
    try:
        resp = core.list_pod_for_all_namespaces(label_selector=DAEMON_LABEL, _preload_content=False,
                                                _request_timeout=timeout_s)
        found = daemon_pods(json.loads(resp.data).get("items") or [])
    except ApiException as exc:
        why = f"cannot list the node daemons' pods ({exc.status} {exc.reason})"
        return {n: NodeUse(error=why) for n in wanted}
    out: dict[str, NodeUse] = {}
    tokens: dict[str, str | ValueError] = {}  # namespace -> a reader token, or why there is none
    for node in wanted:
        if node not in found:
            out[node] = NodeUse(error=f"no running node daemon pod ({DAEMON_LABEL}) on this node")
            continue
        ns, name, port = found[node]
        if ns not in tokens:
            try:
                tokens[ns] = reader_token(core, ns, timeout_s)
            except ValueError as exc:
                tokens[ns] = exc
        token = tokens[ns]
        if isinstance(token, ValueError):
            out[node] = NodeUse(error=str(token))
            continue
        try:
            raw = core.connect_get_namespaced_pod_proxy_with_path(
                f"{name}:{port}", ns, "metrics", _preload_content=False, _request_timeout=timeout_s,
                _headers={FORWARDED_TOKEN_HEADER: token})
            out[node] = NodeUse(parse_metrics(raw.data.decode()))
        except ApiException as exc:
            out[node] = NodeUse(error=f"daemon {ns}/{name} answered {exc.status} {exc.reason}{_why(exc)}")
        except (ValueError, UnicodeDecodeError) as exc:
            out[node] = NodeUse(error=f"daemon {ns}/{name}: its /metrics does not parse: {exc}")
        except Exception as exc:  # timeouts and refused connections: the node's use is unknown, the report goes on
            out[node] = NodeUse(error=f"daemon {ns}/{name} cannot be reached: {exc}")
    return out


def _why(exc: Any) -> str:
    """What a refused proxy call says: the daemon's own answer (plain text, e.g. why it refused the token), or the
    apiserver's hint when the apiserver refused it (a JSON Status)."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    if body.lstrip().startswith("{"):
        return " (inspect needs get on pods/proxy there)" if exc.status == 403 else ""
    return f": {body.strip()[:300]}" if body.strip() else ""
