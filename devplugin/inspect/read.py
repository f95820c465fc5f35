"""Read nodes and pods from the apiserver as JSON (the kubernetes client, raw answers)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client


def read_cluster(api_client: Any, node: str = "", timeout_s: float = 30.0) -> tuple[list[dict], list[dict]]:
    """(nodes, pods): every node, or the one named, and the pods on them (plus unscheduled ones when no node
    is named)."""
    core: Any = client.CoreV1Api(api_client)  # raw answers (_preload_content=False), which its annotations omit
    if node:
        nodes = [json.loads(core.read_node(node, _preload_content=False, _request_timeout=timeout_s).data)]
        resp = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _preload_content=False,
                                                _request_timeout=timeout_s)
    else:
        nodes = json.loads(core.list_node(_preload_content=False, _request_timeout=timeout_s).data)["items"]
        resp = core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=timeout_s)
    return nodes, json.loads(resp.data).get("items") or []
