"""A watch of this node's own object: on_labels(labels) runs when its labels change (the first LIST counts as a
change), so a relabel of the mode or placement reaches the daemon; on_recreated() runs when the Node object comes
back as a new object (deleted and created again: a new UID), whose annotations no longer carry the daemon's
inventory and usage, so the daemon republishes them without a restart. Same LIST + WATCH loop as the pod cache."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable

from kubernetes import client

from devplugin.kube.watch_loop import WatchLoop

log = logging.getLogger(__name__)


class NodeWatch:
    """This node's object, kept current; see the module docstring."""

    def __init__(self, api_client: client.ApiClient, node_name: str, on_labels: Callable[[dict[str, str]], None],
                 *, on_recreated: Callable[[], None] = lambda: None, backoff_start_s: float = 0.2,
                 backoff_max_s: float = 10.0, watch_timeout_s: int = 300,
                 healthy_silence_s: float = 30.0) -> None:
        if not node_name:
            raise ValueError("NodeWatch needs this node's name: set NODE_NAME from the downward API (spec.nodeName)")
        self.node_name = node_name
        self.synced = threading.Event()  # the node object has been read once
        self._on_labels = on_labels
        self._on_recreated = on_recreated
        self._uid = ""  # the UID of the Node object last seen
        self._healthy_silence = healthy_silence_s
        self._lock = threading.Lock()
        self._node: dict | None = None
        self._labels: dict[str, str] | None = None
        core = client.CoreV1Api(api_client)
        list_fn = functools.partial(core.list_node, field_selector=f"metadata.name={node_name}")
        self._loop = WatchLoop("node-watch", list_fn, self._on_list, self._on_event, fields={"node": node_name},
                               backoff_start_s=backoff_start_s, backoff_max_s=backoff_max_s,
                               watch_timeout_s=watch_timeout_s)

    def start(self) -> NodeWatch:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()

    def labels(self) -> dict[str, str] | None:
        """The node's labels as last seen; None before the first read."""
        with self._lock:
            return None if self._labels is None else dict(self._labels)

    def node(self) -> dict | None:
        """The node object (apiserver JSON) as last seen."""
        with self._lock:
            return self._node

    def apiserver_errors(self) -> dict[str, int]:
        """Failed LISTs and watches since start, for metrics."""
        return {"node_watch": self._loop.errors}

    def healthy(self) -> bool:
        return self.synced.is_set() and self._loop.healthy(self._healthy_silence)

    def _on_list(self, items: list[dict], rv: str) -> None:
        if not items:
            log.warning("node %s not found in the apiserver; waiting for it", self.node_name,
                        extra={"fields": {"node": self.node_name}})
            return
        self._update(items[0])

    def _on_event(self, kind: str, obj: dict) -> None:
        if kind == "DELETED":
            log.warning("node object %s was deleted; keeping its last labels", self.node_name,
                        extra={"fields": {"node": self.node_name}})
            return
        self._update(obj)

    def _update(self, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        uid = str(meta.get("uid") or "")
        with self._lock:
            changed = labels != self._labels
            recreated = bool(self._uid) and bool(uid) and uid != self._uid
            self._node, self._labels = obj, labels
            self._uid = uid or self._uid
        self.synced.set()
        if changed:
            self._on_labels(dict(labels))
        if recreated:
            log.warning("node object %s was re-created; publishing this node's GPUs on it again", self.node_name,
                        extra={"fields": {"node": self.node_name, "uid": uid}})
            self._on_recreated()
