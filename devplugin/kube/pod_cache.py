"""A watch-backed cache of the pods bound to this node, read as PodRequests (devplugin.allocation.requests).

The admission path only reads it (pods(), get(): no I/O). A background thread lists the pods with
`spec.nodeName=<node>` and watches from the list's resourceVersion (see watch_loop.py). fetch_now() is the one
direct LIST for a pod bound a moment ago, bounded by its budget. Listeners hear every change, from the watch,
a relist or a direct LIST, in order.

Every pod keeps its resourceVersion, so an event older than what the cache already holds (a direct LIST ran
ahead of the watch) is skipped, and a pod deleted a moment ago is not revived by a stale list or event.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from kubernetes import client

from devplugin.allocation.requests import PodRequest, PodRequestError, pod_request
from devplugin.contract import DEFAULT_RESOURCE_DOMAIN
from devplugin.kube.watch_loop import WatchLoop, short_error

log = logging.getLogger(__name__)

Listener = Callable[[str, PodRequest], None]  # (ADDED | MODIFIED | DELETED, pod)
TOMBSTONES = 1024  # deleted pods remembered, against stale lists and events


def _rv(obj: dict) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class _Fetch:
    """One direct LIST: its answer is published before listeners are told of it."""

    def __init__(self) -> None:
        self.started = False
        self.done = threading.Event()
        self.pods: list[PodRequest] | None = None
        self.error: Exception | None = None


class PodCache:
    """The pods bound to `node_name`; see the module docstring."""

    def __init__(self, api_client: client.ApiClient, node_name: str, domain: str = DEFAULT_RESOURCE_DOMAIN, *,
                 backoff_start_s: float = 0.2, backoff_max_s: float = 10.0, watch_timeout_s: int = 300,
                 healthy_silence_s: float = 30.0) -> None:
        if not node_name:
            raise ValueError("PodCache needs this node's name: set NODE_NAME from the downward API (spec.nodeName)")
        self.node_name = node_name
        self.domain = domain
        self.synced = threading.Event()  # the first LIST is done
        self._healthy_silence = healthy_silence_s
        self._lock = threading.Lock()  # guards the maps below; never held while calling out
        self._order = threading.Lock()  # one thread at a time tells listeners, so they hear changes in order
        self._pods: dict[str, PodRequest] = {}
        self._versions: dict[str, int] = {}
        self._seen = 0  # pods first seen so far: ties between pods created in the same second break by it
        self._deleted: OrderedDict[str, int] = OrderedDict()  # uid -> resourceVersion of its deletion
        self._invalid: dict[str, str] = {}  # "ns/name" -> why its GPU request cannot be read
        self._listeners: list[Listener] = []
        core = client.CoreV1Api(api_client)
        self._list_fn = functools.partial(core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}")
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="pod-fetch")
        self._next: _Fetch | None = None  # the direct LIST submitted last
        self.fetch_failures = 0  # direct LISTs that failed or did not answer within their budget (a metric)
        self._notes: list[tuple[str, PodRequest]] = []  # changes applied, not yet told to listeners
        self._loop = WatchLoop("pod-cache", self._list_fn, self._on_list, self._on_event,
                               fields={"node": node_name}, backoff_start_s=backoff_start_s,
                               backoff_max_s=backoff_max_s, watch_timeout_s=watch_timeout_s)

    # --- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> PodCache:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- reads: no I/O ------------------------------------------------------------------------------------------
    def pods(self) -> list[PodRequest]:
        with self._lock:
            return list(self._pods.values())

    def get(self, uid: str) -> PodRequest | None:
        with self._lock:
            return self._pods.get(uid)

    def invalid(self) -> dict[str, str]:
        """Pods whose GPU request cannot be read ("ns/name" -> why), so a refusal can say so."""
        with self._lock:
            return dict(self._invalid)

    def healthy(self) -> bool:
        """Synced, and the watch is open or the apiserver answered recently."""
        return self.synced.is_set() and self._loop.healthy(self._healthy_silence)

    def apiserver_errors(self) -> dict[str, int]:
        """Failed LISTs and watches, and failed or late direct LISTs, since start, for metrics."""
        return {"pod_watch": self._loop.errors, "pod_fetch": self.fetch_failures}

    def add_listener(self, fn: Listener) -> None:
        """fn(event_type, pod) on every change, off the watch thread (or fetch_now's); keep it quick."""
        with self._lock:
            self._listeners.append(fn)

    # --- the one direct read ------------------------------------------------------------------------------------
    def fetch_now(self, budget_s: float) -> list[PodRequest] | None:
        """One direct LIST of this node's pods, answered within budget_s (None on timeout or error); the cache
        gets its result too, and listeners hear of it afterwards (the answer never waits for a listener).
        Calls that overlap share one LIST started after they were made."""
        if budget_s <= 0:
            return None
        t0 = time.monotonic()
        with self._lock:  # a LIST not started yet is fresh enough for this call; a running one may not be
            fetch = self._next
            if fetch is None or fetch.started:
                fetch = self._next = _Fetch()
                try:
                    self._executor.submit(self._direct_list, fetch, budget_s)
                except RuntimeError:  # stopped
                    return None
        if not fetch.done.wait(budget_s):
            self.fetch_failures += 1
            log.warning("direct pod LIST did not answer within %.0f ms", budget_s * 1000,
                        extra={"fields": {"node": self.node_name, "budget_ms": round(budget_s * 1000)}})
            return None
        if fetch.error is not None:
            self.fetch_failures += 1
            log.warning("direct pod LIST failed after %.0f ms: %s", (time.monotonic() - t0) * 1000,
                        short_error(fetch.error), extra={"fields": {"node": self.node_name}})
            return None
        return fetch.pods

    def _direct_list(self, fetch: _Fetch, timeout_s: float) -> None:
        fetch.started = True
        try:
            resp: Any = self._list_fn(_preload_content=False, _request_timeout=(timeout_s, timeout_s))
            doc = json.loads(resp.data)
            with self._lock:
                self._replace_locked(list(doc.get("items") or []), _rv(doc))
                fetch.pods = list(self._pods.values())
        except Exception as exc:  # noqa: BLE001 - urllib3, socket and API errors alike: the caller logs it
            fetch.error = exc
        finally:
            fetch.done.set()
        self._drain()

    # --- applying changes ---------------------------------------------------------------------------------------
    def _on_list(self, items: list[dict], rv: str) -> None:
        with self._lock:
            self._replace_locked(items, int(rv) if rv.isdigit() else 0)
        self.synced.set()
        self._drain()

    def _on_event(self, kind: str, obj: dict) -> None:
        with self._lock:
            self._notes += self._apply_locked(kind, obj)
        self._drain()

    def _replace_locked(self, items: list[dict], list_rv: int) -> None:
        """A full LIST at list_rv: apply every item, and drop pods it lacks that are not newer than it."""
        seen = set()
        for obj in items:
            seen.add((obj.get("metadata") or {}).get("uid", ""))
            self._notes += self._apply_locked("MODIFIED", obj)
        for uid in [u for u in self._pods if u not in seen and self._versions.get(u, 0) <= list_rv]:
            self._notes.append(("DELETED", self._pods.pop(uid)))
            self._versions.pop(uid, None)
            self._tombstone(uid, list_rv)

    def _apply_locked(self, kind: str, obj: dict) -> list[tuple[str, PodRequest]]:
        meta = obj.get("metadata") or {}
        uid, rv = str(meta.get("uid", "")), _rv(obj)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if not uid or (rv and (rv < self._versions.get(uid, 0) or rv <= self._deleted.get(uid, 0))):
            return []  # stale: the cache already holds newer news of this pod
        if kind != "DELETED" and rv and rv == self._versions.get(uid) and uid in self._pods:
            return []  # unchanged (a relist, or a direct LIST): no need to read it again
        if kind == "DELETED":
            self._invalid.pop(key, None)
            self._tombstone(uid, rv)
            self._versions.pop(uid, None)
            gone = self._pods.pop(uid, None)
            return [("DELETED", gone)] if gone is not None else []
        try:
            pod = pod_request(obj, self.domain)
        except PodRequestError as exc:
            if self._invalid.get(key) != str(exc):
                log.warning("pod's GPU request cannot be read: %s", exc, extra={"fields": {"pod": key,
                                                                                          "node": self.node_name}})
            self._invalid[key] = str(exc)
            return []
        self._invalid.pop(key, None)
        old_rv = self._versions.get(uid)
        self._versions[uid] = rv
        before = self._pods.get(uid)
        self._seen += before is None
        pod = replace(pod, seen=before.seen if before is not None else self._seen)
        self._pods[uid] = pod
        return [("ADDED" if old_rv is None else "MODIFIED", pod)]

    def _tombstone(self, uid: str, rv: int) -> None:
        self._deleted[uid] = max(rv, self._deleted.get(uid, 0))
        self._deleted.move_to_end(uid)
        while len(self._deleted) > TOMBSTONES:
            self._deleted.popitem(last=False)

    def _drain(self) -> None:
        """Tell listeners of the changes queued so far, in the order they were applied (one drainer at a time)."""
        with self._order:
            while True:
                with self._lock:
                    notes, self._notes = self._notes, []
                    listeners = list(self._listeners)
                if not notes:
                    return
                for kind, pod in notes:
                    for fn in listeners:
                        try:
                            fn(kind, pod)
                        except Exception:  # noqa: BLE001 - one listener's bug must not stop the cache
                            log.exception("pod listener failed on %s", kind,
                                          extra={"fields": {"pod": pod.key, "node": self.node_name}})
