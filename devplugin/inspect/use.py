"""What each container uses, from the node daemons: their /metrics (the gpushare_container_* series), reached
through the apiserver's pod proxy, so inspect needs no route to the nodes and no endpoint of its own on them.

Why /metrics and not an endpoint of its own: the figures are the ones Prometheus and the dashboard show, the
daemon serves nothing more to anyone, and parsing a node's exposition (a few hundred series) takes milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DAEMON_LABEL = "app=gpushare-devplugin"  # the DaemonSet's pod label (deploy/base, the Helm chart)
HEALTH_PORT_NAME = "health"
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
    """node name -> (namespace, pod name, health port) of a running node daemon on it."""
    out: dict[str, tuple[str, str, int]] = {}
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName")
        if not node or status.get("phase") != "Running":
            continue
        for container in spec.get("containers") or []:
            for port in container.get("ports") or []:
                if port.get("name") == HEALTH_PORT_NAME and isinstance(port.get("containerPort"), int):
                    out[node] = (str(meta.get("namespace", "")), str(meta.get("name", "")), port["containerPort"])
    return out


def read_use(api_client: Any, nodes: Iterable[str], timeout_s: float = 10.0) -> dict[str, NodeUse]:
    """Each node's per-container use from its daemon, through the apiserver's pod proxy (get pods/proxy on the
    daemon's namespace). A node whose daemon cannot be reached gets NodeUse.error saying why."""
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
    for node in wanted:
        if node not in found:
            out[node] = NodeUse(error=f"no running node daemon pod ({DAEMON_LABEL}) on this node")
            continue
        ns, name, port = found[node]
        try:
            raw = core.connect_get_namespaced_pod_proxy_with_path(
                f"{name}:{port}", ns, "metrics", _preload_content=False, _request_timeout=timeout_s)
            out[node] = NodeUse(parse_metrics(raw.data.decode()))
        except ApiException as exc:
            hint = " (inspect needs get on pods/proxy there)" if exc.status == 403 else ""
            out[node] = NodeUse(error=f"daemon {ns}/{name} answered {exc.status} {exc.reason}{hint}")
        except (ValueError, UnicodeDecodeError) as exc:
            out[node] = NodeUse(error=f"daemon {ns}/{name}: its /metrics does not parse: {exc}")
        except Exception as exc:  # timeouts and refused connections: the node's use is unknown, the report goes on
            out[node] = NodeUse(error=f"daemon {ns}/{name} cannot be reached: {exc}")
    return out
