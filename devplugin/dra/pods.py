"""The pods bound to this node, from a watch: what the prepare-time conflict check reads of them without a GET.

NodePrepareResources names claims only; the check that no container gets two requests of this driver reads the
pods the claims are reserved for (which containers use which claims). The kubelet prepares a pod's claims once
the pod is bound here, so those pods are in a watch of `spec.nodeName=<node>` (one LIST + WATCH, as the node
daemon's pod cache: devplugin/kube/watch_loop.py). Only the fields the check reads are kept: the pod's UID, its
claims (spec.resourceClaims, status.resourceClaimStatuses) and each container's name and claims.

get() answers a pod only when the watch holds it with the UID the claim is reserved for; otherwise (the watch has
not shown it yet, or the pod was re-created) the caller reads it from the apiserver as before.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from kubernetes import client

from devplugin.kube.watch_loop import WatchLoop

log = logging.getLogger(__name__)


def _obj(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def claims_view(pod: dict) -> dict:
    """The parts of a Pod (apiserver JSON) the conflict check reads, in the Pod's own shape."""
    meta, spec, status = _obj(pod.get("metadata")), _obj(pod.get("spec")), _obj(pod.get("status"))

    def containers(kind: str) -> list[dict]:
        return [{"name": c.get("name"), "resources": {"claims": _obj(c.get("resources")).get("claims") or []}}
                for c in _list(spec.get(kind)) if isinstance(c, dict)]

    return {"metadata": {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid")},
            "spec": {"resourceClaims": spec.get("resourceClaims") or [],
                     "initContainers": containers("initContainers"), "containers": containers("containers")},
            "status": {"resourceClaimStatuses": status.get("resourceClaimStatuses") or []}}


class PodsOnNode:
    """See the module docstring."""

    def __init__(self, api_client: Any, node_name: str, *, watch_timeout_s: int = 300,
                 backoff_start_s: float = 0.2) -> None:
        if not node_name:
            raise ValueError("PodsOnNode needs this node's name: set NODE_NAME from the downward API (spec.nodeName)")
        self.node_name = node_name
        self.synced = threading.Event()  # the first LIST is in
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict] = {}
        core = client.CoreV1Api(api_client)
        list_fn = functools.partial(core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}")
        self._loop = WatchLoop("dra-pods", list_fn, self._on_list, self._on_event, fields={"node": node_name},
                               backoff_start_s=backoff_start_s, watch_timeout_s=watch_timeout_s)

    def start(self) -> PodsOnNode:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()

    def get(self, namespace: str, name: str, uid: str) -> dict | None:
        """The pod as the watch last showed it, when it has this UID; None otherwise."""
        with self._lock:
            pod = self._pods.get((namespace, name))
        if pod is None or not uid or pod["metadata"]["uid"] != uid:
            return None
        return pod

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    @staticmethod
    def _key(obj: dict) -> tuple[str, str]:
        meta = _obj(obj.get("metadata"))
        return str(meta.get("namespace", "")), str(meta.get("name", ""))

    def _on_list(self, items: list[dict], rv: str) -> None:
        pods = {self._key(o): claims_view(o) for o in items if isinstance(o, dict)}
        with self._lock:
            self._pods = pods
        self.synced.set()
        log.debug("pods on this node listed: %d", len(pods), extra={"fields": {"node": self.node_name, "rv": rv}})

    def _on_event(self, kind: str, obj: dict) -> None:
        key = self._key(obj)
        if kind in ("ADDED", "MODIFIED"):
            view = claims_view(obj)
            with self._lock:
                self._pods[key] = view
        elif kind == "DELETED":
            with self._lock:
                self._pods.pop(key, None)
