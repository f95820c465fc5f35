"""The apiserver side of bind, through the real `kubernetes` client."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from devplugin.kube.client import drain


class KubeCluster:
    """Reads pods and creates Bindings (with the GPU choice as annotations)."""

    def __init__(self, api_client: Any, timeout_s: float = 5.0) -> None:
        # Any: the calls below take raw answers (_preload_content=False) and send plain dicts, which the client
        # accepts but its annotations do not describe.
        self.core: Any = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    def get_pod(self, namespace: str, name: str) -> dict:
        resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False,
                                             _request_timeout=self.timeout_s)
        return json.loads(resp.data)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": dict(annotations)}
        if uid:
            meta["uid"] = uid  # the apiserver refuses the Binding if the pod was re-created meanwhile
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # The apiserver answers a Status the client cannot read back as a V1Binding: take the raw answer.
        drain(self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False,
                                                      _request_timeout=self.timeout_s))
