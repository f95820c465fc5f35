"""List then watch one resource kind into ClusterState, relisting after a 410 or a broken connection.

Objects stay apiserver JSON (dicts): the client is asked for raw answers, not its model classes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)


class Informer:
    """One thread: list (replace everything), then watch from the list's resourceVersion."""

    def __init__(self, kind: str, list_fn: Callable[..., Any], replace: Callable[[Iterable[Mapping]], None],
                 upsert: Callable[[Mapping], None], delete: Callable[[Mapping], None],
                 watch_timeout_s: int = 300, retry_s: float = 1.0) -> None:
        self.kind = kind
        self._list = list_fn
        self._replace, self._upsert, self._delete = replace, upsert, delete
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)
        self.relists = 0

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()  # wakes the thread blocked reading the watch
            except Exception:  # an already closed connection
                pass
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rv = self._relist()
                while not self._stop.is_set():
                    rv = self._watch_from(rv)
            except ApiException as exc:
                if self._stop.is_set():
                    break
                if exc.status == 410:
                    log.info("%s watch expired (410 Gone); listing again", self.kind)
                    continue
                log.warning("%s list/watch failed: %s; retrying in %.0f s", self.kind, exc.reason or exc,
                            self.retry_s)
            except Exception as exc:  # connection refused or reset, timeouts
                if self._stop.is_set():
                    break
                log.warning("%s list/watch failed: %s; retrying in %.0f s", self.kind, exc, self.retry_s)
            self._stop.wait(self.retry_s)

    def _relist(self) -> str:
        resp = self._list(_preload_content=False, _request_timeout=30)
        doc = json.loads(resp.data)
        self._replace(doc.get("items") or [])
        self.relists += 1
        rv = str((doc.get("metadata") or {}).get("resourceVersion", ""))
        log.debug("%s listed: %d", self.kind, len(doc.get("items") or []), extra={"fields": {"rv": rv}})
        return rv

    def _watch_from(self, rv: str) -> str:
        resp = self._list(watch=True, resource_version=rv, timeout_seconds=self.watch_timeout_s,
                          allow_watch_bookmarks=True, _preload_content=False,
                          _request_timeout=self.watch_timeout_s + 30)
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("message", "")))
                if kind in ("ADDED", "MODIFIED"):
                    self._upsert(obj)
                elif kind == "DELETED":
                    self._delete(obj)
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = str(new_rv)
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        return rv


def start_informers(api_client: Any, state: Any, watch_timeout_s: int = 300) -> list[Informer]:
    """Nodes and pods (all namespaces) into a ClusterState."""
    core = client.CoreV1Api(api_client)
    nodes = Informer("nodes", core.list_node, state.replace_nodes, state.upsert_node,
                     lambda o: state.delete_node(str((o.get("metadata") or {}).get("name", ""))),
                     watch_timeout_s)
    pods = Informer("pods", core.list_pod_for_all_namespaces, state.replace_pods, state.upsert_pod,
                    state.delete_pod, watch_timeout_s)
    return [nodes.start(), pods.start()]
