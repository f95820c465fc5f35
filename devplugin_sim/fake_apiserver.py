"""An HTTP fake of the Kubernetes API endpoints the project uses, so the real `kubernetes` client runs against it.

    with FakeApiserver() as api:
        api.add_node("gpu-node-1", labels={"ack.node.gpu.schedule": "core_mem"})
        api.add_pod(name="p", node_name="gpu-node-1", limits={"aliyun.com/gpu-mem": 2})
        client = kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path)

Served by threads on 127.0.0.1 (an ephemeral port, plain http). Endpoints: pods and nodes (get, list, watch,
patch; pods also create, delete, binding), core/v1 and events.k8s.io/v1 events, coordination.k8s.io/v1 leases.
List and watch take fieldSelector (key=value, key!=value on any dotted field) and labelSelector (equality and
existence); watch takes resourceVersion, allowWatchBookmarks and timeoutSeconds and streams JSON lines. A watch
from a resourceVersion older than the history (see compact()) gets an ERROR event with a 410 Status.
Strategic merge patches are applied as JSON merge patches (lists are replaced), which is exact for labels and
annotations. A binding answers a Status (like the real apiserver), which the Python client cannot deserialize
into V1Binding: call it with `_preload_content=False`.

The pod proxy (GET .../pods/NAME:PORT/proxy/PATH) forwards to the pod's status.podIP.

Faults for tests: down("refuse" | "reset" | "503") and up(), delay(seconds) before every request, compact()
(every resourceVersion handed out so far becomes too old: open watches get 410), close_watches().
"""

from __future__ import annotations

import copy
import json
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from devplugin_sim.fake_apiserver_http import EVENTS, NODES, PODS, Server
from devplugin_sim.fake_apiserver_state import Request, ServedState
from devplugin_sim.fake_apiserver_store import merge_object

__all__ = ["FakeApiserver"]
DOWN_MODES = ("refuse", "reset", "503")


class FakeApiserver:
    """The fake apiserver; see the module docstring."""

    def __init__(self, bookmark_interval_s: float = 1.0) -> None:
        self.state = ServedState(bookmark_interval_s)
        self.store = self.state.store
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="fake-apiserver-")
        self.kubeconfig_path = str(Path(self._dir.name) / "kubeconfig")
        self.port = 0

    @staticmethod
    def token_user(token: str) -> str | None:
        """The user a token from this fake's TokenRequest names (system:serviceaccount:NS:NAME), else None."""
        kind, _, rest = token.partition(":")
        ns, _, name = rest.partition(":")
        return f"system:serviceaccount:{ns}:{name}" if kind == "fake-token" and ns and name else None

    # --- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> FakeApiserver:
        self._server = Server(self.state)
        self.port = self._server.server_address[1]
        self._serve()
        Path(self.kubeconfig_path).write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        }))
        return self

    def stop(self) -> None:
        if self._server is not None:
            if self.state.down_mode != "refuse":
                self._server.shutdown()
            self.state.down_mode = "stopped"
            self._drop_connections()
            self._server.server_close()
            self._server = None
        self._dir.cleanup()

    def __enter__(self) -> FakeApiserver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        """A kubernetes.client.ApiClient for this fake."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig_path)

    def _serve(self) -> None:
        assert self._server is not None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()

    # --- faults -------------------------------------------------------------------------------------------------
    def down(self, mode: str = "refuse") -> None:
        """refuse: the port is closed; reset: connections are reset; 503: every request answers 503.
        Open connections (watches included) are cut in every mode."""
        if mode not in DOWN_MODES:
            raise ValueError(f"down mode {mode!r} is not one of {DOWN_MODES}")
        assert self._server is not None, "start() the fake first"
        self.up()
        self.state.down_mode = mode
        if mode == "refuse":
            self._server.shutdown()
            self._server.socket.close()
        self._drop_connections()

    def up(self) -> None:
        assert self._server is not None, "start() the fake first"
        if self.state.down_mode == "refuse":
            self._server.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._server.server_bind()  # the same port: server_address holds it
            self._server.server_activate()
            self._serve()
        self.state.down_mode = ""

    def delay(self, seconds: float) -> None:
        """Sleep this long before answering each request (0 to stop)."""
        self.state.delay_s = max(0.0, float(seconds))

    def compact(self) -> None:
        """Every resourceVersion handed out so far becomes too old: watches from it (open ones too) get 410."""
        self.store.compact()

    def close_watches(self) -> None:
        """End every open watch cleanly, as the apiserver does when a watch times out."""
        self.store.close_watches()

    def _drop_connections(self) -> None:
        for conn in self.state.connections():
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.store.close_watches()

    # --- state helpers for tests ----------------------------------------------------------------------------------
    def add_node(self, name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
                 capacity: dict[str, Any] | None = None) -> dict:
        cap = {k: str(v) for k, v in (capacity or {}).items()}
        return self.store.create(NODES, "", {
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            "spec": {}, "status": {"capacity": cap, "allocatable": dict(cap)},
        })

    def add_pod(self, pod: dict | None = None, *, name: str = "", namespace: str = "default", node_name: str = "",
                limits: dict[str, Any] | None = None, containers: list[dict] | None = None,
                init_containers: list[dict] | None = None, labels: dict[str, str] | None = None,
                annotations: dict[str, str] | None = None, phase: str = "Pending",
                created: str | None = None) -> dict:
        """A pod from a full dict, or from the arguments (one container "main" with `limits` by default).
        Fills uid, resourceVersion, creationTimestamp, namespace and status.phase."""
        if pod is None:
            if containers is None:
                lim = {k: str(v) for k, v in (limits or {}).items()}
                containers = [{"name": "main", "image": "busybox", "resources": {"limits": lim, "requests": lim}}]
            spec: dict[str, Any] = {"containers": containers}
            if init_containers:
                spec["initContainers"] = init_containers
            if node_name:
                spec["nodeName"] = node_name
            pod = {"metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                                "annotations": dict(annotations or {})}, "spec": spec, "status": {"phase": phase}}
            if created:
                pod["metadata"]["creationTimestamp"] = created
        pod = copy.deepcopy(pod)
        pod.setdefault("spec", {}).setdefault("containers", [])
        pod.setdefault("status", {}).setdefault("phase", "Pending")
        ns = (pod.get("metadata") or {}).get("namespace") or namespace
        return self.store.create(PODS, ns, pod)

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> dict:
        return self.store.update(PODS, namespace, name, lambda p: merge_object(p, {"status": {"phase": phase}}))

    def patch_pod(self, namespace: str, name: str, patch: dict) -> dict:
        """A JSON merge patch, as a controller would apply it."""
        return self.store.update(PODS, namespace, name, lambda p: merge_object(p, patch))

    def patch_node(self, name: str, patch: dict) -> dict:
        return self.store.update(NODES, "", name, lambda n: merge_object(n, patch))

    def delete_node(self, name: str) -> dict:
        return self.store.delete(NODES, "", name)

    def delete_pod(self, namespace: str, name: str) -> dict:
        return self.store.delete(PODS, namespace, name)

    def pod(self, namespace: str, name: str) -> dict:
        return self.store.get(PODS, namespace, name)

    def node(self, name: str) -> dict:
        return self.store.get(NODES, "", name)

    @property
    def events(self) -> list[dict]:
        """Every Event now stored (core/v1 then events.k8s.io/v1), in creation order."""
        with self.store.cond:
            return [copy.deepcopy(e) for r in (EVENTS, ("events.k8s.io", "events"))
                    for e in self.store.objects[r].values()]

    def requests_matching(self, method: str, path_suffix: str, watch: bool | None = None) -> list[Request]:
        return self.state.requests_matching(method, path_suffix, watch)


