"""Writes to the apiserver off the admission path: pod and node annotations, and Events.

Callers only queue (never block, never raise for the apiserver's sake); one background thread sends, in order,
and keeps retrying with backoff (0.2 s doubling to 10 s) while the apiserver is unreachable or answers 5xx/429,
so what was queued while it was down is sent once it is back. Successive annotation patches of one object are
merged into one. A patch of a pod that is gone (404) or was replaced by another with the same name (its uid
differs: the patch carries the uid as a precondition, 409) is dropped with a log line.

Events are core/v1 Events (involvedObject, source, reportingComponent, first/lastTimestamp, count). Repeats of
one (object, type, reason, message) are aggregated into one Event whose count grows, like the kubelet's.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devplugin.kube.client import drain
from devplugin.kube.watch_loop import short_error

log = logging.getLogger(__name__)

COMPONENT = "gpushare-device-plugin"
MERGE_PATCH = "application/merge-patch+json"
EVENT_TYPES = ("Normal", "Warning")
SENT_EVENTS_KEPT = 4096  # Events remembered for aggregation
TRANSIENT = {408, 429, 500, 502, 503, 504}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Patch:
    kind: str  # Pod | Node
    namespace: str
    name: str
    uid: str
    annotations: dict[str, str | None]


@dataclass
class _Event:
    involved: dict[str, str]
    type: str
    reason: str
    message: str
    repeats: int = 1  # occurrences not yet sent
    first: str = field(default_factory=_now)
    last: str = field(default_factory=_now)


class KubeWriter:
    """The queue and its sender thread; see the module docstring."""

    def __init__(self, api_client: client.ApiClient, node_name: str = "", *, component: str = COMPONENT,
                 backoff_start_s: float = 0.2, backoff_max_s: float = 10.0, request_timeout_s: float = 10.0,
                 max_queued: int = 10000) -> None:
        self.node_name = node_name
        self.component = component
        self._core = client.CoreV1Api(api_client)
        self._backoff_start, self._backoff_max = backoff_start_s, backoff_max_s
        self._timeout = (min(5.0, request_timeout_s), request_timeout_s)
        self._max_queued = max_queued
        self._cond = threading.Condition()
        self._queue: OrderedDict[tuple, _Patch | _Event] = OrderedDict()
        self._busy = False  # an item is being sent
        self._sent: OrderedDict[tuple, tuple[str, str, int]] = OrderedDict()  # event key -> (ns, name, count)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failures = 0  # consecutive failed sends (the apiserver is down while this grows)
        self.errors = 0  # failed sends since start, retried or dropped (a metric: never reset)

    # --- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> KubeWriter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kube-writer", daemon=True)
            self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Send what is queued (up to flush_timeout_s), then stop the thread."""
        self.flush(flush_timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(self._timeout[1] + 1)

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued was sent or dropped; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def apiserver_errors(self) -> dict[str, int]:
        """Failed sends since start, for metrics."""
        return {"write": self.errors}

    def pending(self) -> int:
        """Items queued or being sent."""
        with self._cond:
            return len(self._queue) + int(self._busy)

    # --- what callers queue -------------------------------------------------------------------------------------
    def patch_pod_annotations(self, namespace: str, name: str, uid: str, annotations: dict[str, str | None]) -> None:
        """Merge-patch a pod's annotations (None removes one); dropped if the pod is gone or its uid differs."""
        self._queue_patch(_Patch("Pod", namespace, name, uid, dict(annotations)))

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None]) -> None:
        self._queue_patch(_Patch("Node", "", name, "", dict(annotations)))

    def pod_event(self, namespace: str, name: str, uid: str, type: str, reason: str, message: str) -> None:  # noqa: A002
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        self._queue_event(_Event(involved, type, reason, message))

    def node_event(self, name: str, type: str, reason: str, message: str) -> None:  # noqa: A002
        # The kubelet uses the node name as the uid of a Node's events; kubectl describe node finds them so.
        involved = {"apiVersion": "v1", "kind": "Node", "namespace": "", "name": name, "uid": name}
        self._queue_event(_Event(involved, type, reason, message))

    def _queue_patch(self, patch: _Patch) -> None:
        key = ("patch", patch.kind, patch.namespace, patch.name, patch.uid)
        with self._cond:
            queued = self._queue.get(key)
            if isinstance(queued, _Patch):
                queued.annotations.update(patch.annotations)
            else:
                self._put_locked(key, patch)

    def _queue_event(self, event: _Event) -> None:
        if event.type not in EVENT_TYPES:
            raise ValueError(f"event type {event.type!r} is not one of {EVENT_TYPES}")
        inv = event.involved
        key = ("event", inv["kind"], inv["namespace"], inv["name"], inv["uid"], event.type, event.reason,
               event.message)
        with self._cond:
            queued = self._queue.get(key)
            if isinstance(queued, _Event):
                queued.repeats += 1
                queued.last = event.last
            else:
                self._put_locked(key, event)

    def _put_locked(self, key: tuple, item: _Patch | _Event) -> None:
        if len(self._queue) >= self._max_queued:
            old_key, _ = self._queue.popitem(last=False)
            log.warning("writer queue full (%d): dropped the oldest item %s", self._max_queued, old_key[:4],
                        extra={"fields": {"node": self.node_name}})
        self._queue[key] = item
        self._cond.notify_all()

    # --- the sender ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = self._backoff_start
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                key, item = self._queue.popitem(last=False)
                self._busy = True
            retry = False
            try:
                self._send(item)
                if self.failures:
                    log.info("apiserver writes work again after %d failures", self.failures,
                             extra={"fields": {"node": self.node_name}})
                self.failures, backoff = 0, self._backoff_start
            except Exception as exc:  # noqa: BLE001 - urllib3, socket and API errors alike
                retry = self._failed(item, exc)
            with self._cond:
                if retry:
                    self._requeue_locked(key, item)
                self._busy = False
                self._cond.notify_all()
                resume = time.monotonic() + backoff
                while retry and not self._stopping and time.monotonic() < resume:
                    self._cond.wait(resume - time.monotonic())  # new items do not cut the backoff short
            if retry:
                backoff = min(backoff * 2, self._backoff_max)
            if retry and self._stopping:
                return

    def _requeue_locked(self, key: tuple, item: _Patch | _Event) -> None:
        """Put a failed item back first, merged with what was queued for the same key meanwhile."""
        queued = self._queue.pop(key, None)
        if isinstance(item, _Patch) and isinstance(queued, _Patch):
            item.annotations.update(queued.annotations)
        elif isinstance(item, _Event) and isinstance(queued, _Event):
            item.repeats += queued.repeats
            item.last = queued.last
        self._queue[key] = item
        self._queue.move_to_end(key, last=False)

    def _failed(self, item: _Patch | _Event, exc: Exception) -> bool:
        """Log a failed send; True when it is worth retrying."""
        self.errors += 1
        fields = _fields(item, self.node_name)
        status = exc.status if isinstance(exc, ApiException) else None
        if status is not None and status not in TRANSIENT:
            if isinstance(item, _Patch) and item.kind == "Pod" and status in (404, 409):
                why = "is gone" if status == 404 else "was replaced by another pod of that name (uid differs)"
                log.info("pod %s/%s %s: annotation patch dropped", item.namespace, item.name, why,
                         extra={"fields": {**fields, "status": status}})
            elif isinstance(item, _Event) and status == 404:
                log.info("event dropped: its namespace is gone", extra={"fields": {**fields, "status": status}})
            else:
                log.error("apiserver refused a write (HTTP %s %s): dropped; %s", status, getattr(exc, "reason", ""),
                          _hint(status), extra={"fields": {**fields, "status": status}})
            return False
        self.failures += 1
        level = logging.WARNING if self.failures == 1 or self.failures % 20 == 0 else logging.DEBUG
        log.log(level, "apiserver write failed (%s); %d queued, retrying", short_error(exc), self.pending(),
                extra={"fields": {**fields, "tries": self.failures}})
        return True

    def _send(self, item: _Patch | _Event) -> None:
        if isinstance(item, _Patch):
            meta: dict[str, object] = {"annotations": item.annotations}
            if item.uid:
                meta["uid"] = item.uid  # a precondition: a pod of the same name but another uid answers 409
            if item.kind == "Pod":
                drain(self._core.patch_namespaced_pod(item.name, item.namespace, {"metadata": meta},
                                                      _content_type=MERGE_PATCH, _preload_content=False,
                                                      _request_timeout=self._timeout))
            else:
                drain(self._core.patch_node(item.name, {"metadata": meta}, _content_type=MERGE_PATCH,
                                            _preload_content=False, _request_timeout=self._timeout))
            return
        self._send_event(item)

    def _send_event(self, ev: _Event) -> None:
        inv = ev.involved
        key = (inv["kind"], inv["namespace"], inv["name"], inv["uid"], ev.type, ev.reason, ev.message)
        namespace = inv["namespace"] or "default"
        sent = self._sent.get(key)
        if sent is not None:
            ns, name, count = sent
            try:
                drain(self._core.patch_namespaced_event(name, ns, {"count": count + ev.repeats,
                                                                   "lastTimestamp": ev.last},
                                                        _content_type=MERGE_PATCH, _preload_content=False,
                                                        _request_timeout=self._timeout))
                self._remember(key, (ns, name, count + ev.repeats))
                return
            except ApiException as exc:
                if exc.status != 404:  # 404: the Event expired (its TTL); create a new one below
                    raise
        name = f"{inv['name']}.{time.time_ns():x}"
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {k: v for k, v in inv.items() if v},
            "type": ev.type, "reason": ev.reason, "message": ev.message[:1024],
            "source": {"component": self.component, "host": self.node_name or socket.gethostname()},
            "reportingComponent": self.component, "reportingInstance": self.node_name or socket.gethostname(),
            "firstTimestamp": ev.first, "lastTimestamp": ev.last, "count": ev.repeats,
        }
        drain(self._core.create_namespaced_event(namespace, cast(Any, body), _preload_content=False,
                                                 _request_timeout=self._timeout))
        self._remember(key, (namespace, name, ev.repeats))

    def _remember(self, key: tuple, value: tuple[str, str, int]) -> None:
        self._sent[key] = value
        self._sent.move_to_end(key)
        while len(self._sent) > SENT_EVENTS_KEPT:
            self._sent.popitem(last=False)


def _fields(item: _Patch | _Event, node: str) -> dict[str, object]:
    if isinstance(item, _Patch):
        what = {"pod": f"{item.namespace}/{item.name}"} if item.kind == "Pod" else {"target_node": item.name}
        return {**what, "node": node, "write": "annotations"}
    inv = item.involved
    what = {"pod": f"{inv['namespace']}/{inv['name']}"} if inv["kind"] == "Pod" else {"target_node": inv["name"]}
    return {**what, "node": node, "write": "event", "reason": item.reason}


def _hint(status: int) -> str:
    if status in (401, 403):
        return "check the daemon's ServiceAccount RBAC (pods patch, nodes patch, events create/patch)"
    return "this write cannot succeed as is"
