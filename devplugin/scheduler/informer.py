"""Nodes and pods into ClusterState over the project's LIST + WATCH loop (devplugin.kube.watch_loop): each LIST
replaces everything, then ADDED/MODIFIED events upsert and DELETED ones delete. The loop relists on 410 Gone and
reconnects with backoff when the apiserver is down.

Objects stay apiserver JSON (dicts): the client is asked for raw answers, not its model classes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes import client

from devplugin.kube.watch_loop import ListFn, WatchLoop

log = logging.getLogger(__name__)


class Informer:
    """One resource kind: a WatchLoop whose list replaces and whose events upsert or delete."""

    def __init__(self, kind: str, list_fn: ListFn, replace: Callable[[Iterable[Mapping]], None],
                 upsert: Callable[[Mapping], None], delete: Callable[[Mapping], None],
                 watch_timeout_s: int = 300, retry_s: float = 0.2) -> None:
        self.kind = kind
        self._replace, self._upsert, self._delete = replace, upsert, delete
        self._loop = WatchLoop(f"informer-{kind}", list_fn, self._on_list, self._on_event,
                               fields={"kind": kind}, backoff_start_s=retry_s, watch_timeout_s=watch_timeout_s)

    @property
    def relists(self) -> int:
        """LISTs done: the first, and one after each expired watch."""
        return self._loop.lists

    def start(self) -> Informer:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()

    def _on_list(self, items: list[dict], rv: str) -> None:
        self._replace(items)
        log.debug("%s listed: %d", self.kind, len(items), extra={"fields": {"rv": rv}})

    def _on_event(self, kind: str, obj: dict) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._upsert(obj)
        elif kind == "DELETED":
            self._delete(obj)


def start_informers(api_client: Any, state: Any, watch_timeout_s: int = 300,
                    retry_s: float = 0.2) -> list[Informer]:
    """Nodes and pods (all namespaces) into a ClusterState; `retry_s` is the first reconnect delay."""
    core = client.CoreV1Api(api_client)
    nodes = Informer("nodes", core.list_node, state.replace_nodes, state.upsert_node,
                     lambda o: state.delete_node(str((o.get("metadata") or {}).get("name", ""))),
                     watch_timeout_s, retry_s)
    pods = Informer("pods", core.list_pod_for_all_namespaces, state.replace_pods, state.upsert_pod,
                    state.delete_pod, watch_timeout_s, retry_s)
    return [nodes.start(), pods.start()]
