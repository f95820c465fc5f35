"""One LIST + WATCH loop, shared by the pod cache and the node watch: list, then watch from the list's
resourceVersion (with bookmarks), relist on 410 Gone, reconnect with backoff when the apiserver is down.

Objects travel as raw dicts (the apiserver's JSON), never as the client's models: cheaper, and what
devplugin.allocation.requests reads. Runs in one daemon thread; the callbacks run on it.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

ListFn = Callable[..., Any]  # a kubernetes client list_* method bound to its selectors (functools.partial)


class Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class WatchLoop:
    """Calls on_list(items, resource_version) after every LIST, then on_event(type, obj) for each ADDED,
    MODIFIED or DELETED event. Exceptions from the callbacks are logged and do not stop the loop."""

    def __init__(self, name: str, list_fn: ListFn, on_list: Callable[[list[dict], str], None],
                 on_event: Callable[[str, dict], None], *, fields: dict[str, str] | None = None,
                 backoff_start_s: float = 0.2, backoff_max_s: float = 10.0, watch_timeout_s: int = 300,
                 connect_timeout_s: float = 5.0) -> None:
        self.name = name
        self._list_fn = list_fn
        self._on_list = on_list
        self._on_event = on_event
        self._fields = dict(fields or {})
        self._backoff_start = backoff_start_s
        self._backoff_max = backoff_max_s
        self._watch_timeout = watch_timeout_s
        self._connect_timeout = connect_timeout_s
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self.resource_version = ""
        self.connected = False  # a watch stream is open now
        self.last_contact = 0.0  # time.monotonic() of the last answer from the apiserver
        self.lists = 0  # LISTs done (the first, and every relist)
        self.errors = 0  # failed LISTs and watches since start (a metric: never reset)
        self._failures = 0  # failed tries since the apiserver last answered
        self._down_since = 0.0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()  # unblocks the thread's read of the stream
            except Exception:  # noqa: BLE001 - the stream may already be gone
                pass
        if self._thread is not None:
            self._thread.join(timeout_s)

    def healthy(self, max_silence_s: float) -> bool:
        """A watch is open, or the apiserver answered within max_silence_s."""
        return self.connected or (self.last_contact > 0 and time.monotonic() - self.last_contact < max_silence_s)

    def _run(self) -> None:
        backoff = self._backoff_start
        rv = ""
        gones = 0
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list()
                rv = self._watch(rv)
                gones = 0
            except Gone:
                gones += 1
                log.info("%s: resourceVersion %s is too old (410 Gone); relisting", self.name, rv,
                         extra={"fields": self._fields})
                rv = ""
                if gones > 1:  # 410 again right after a relist: do not spin
                    self._stop.wait(self._backoff_start)
            except Exception as exc:  # noqa: BLE001 - the client raises urllib3, socket and API errors alike
                self.connected = False
                if self._stop.is_set():
                    break
                self.errors += 1
                if self._failures == 0:
                    self._down_since = time.monotonic()
                    backoff = self._backoff_start
                self._failures += 1
                level = logging.WARNING if self._failures == 1 or self._failures % 10 == 0 else logging.DEBUG
                log.log(level, "%s: apiserver unreachable (%s, %d tries); retrying in %.1f s", self.name,
                        short_error(exc), self._failures, backoff,
                        extra={"fields": {**self._fields, "retry_s": round(backoff, 2), "tries": self._failures}})
                self._stop.wait(backoff * random.uniform(0.9, 1.1))
                backoff = min(backoff * 2, self._backoff_max)
        self.connected = False

    def _reached(self) -> None:
        """The apiserver answered: log a recovery once, and the next outage's backoff starts small again."""
        self.last_contact = time.monotonic()
        if self._failures:
            log.info("%s: apiserver reachable again after %.1f s (%d tries)", self.name,
                     time.monotonic() - self._down_since, self._failures, extra={"fields": self._fields})
            self._failures = 0

    def _list(self) -> str:
        resp = self._list_fn(_preload_content=False, _request_timeout=(self._connect_timeout, 60))
        doc = json.loads(resp.data)
        rv = str((doc.get("metadata") or {}).get("resourceVersion") or "")
        self._reached()
        self.lists += 1
        self.resource_version = rv
        try:
            self._on_list(list(doc.get("items") or []), rv)
        except Exception:  # noqa: BLE001 - a listener's bug must not stop the watch
            log.exception("%s: handling the list failed", self.name, extra={"fields": self._fields})
        return rv

    def _watch(self, rv: str) -> str:
        """Stream events from rv until the server ends the watch; the last resourceVersion seen."""
        timeout = int(self._watch_timeout * random.uniform(0.8, 1.0)) or 1
        try:
            resp = self._list_fn(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                 timeout_seconds=timeout, _preload_content=False,
                                 _request_timeout=(self._connect_timeout, timeout + 30))
        except ApiException as exc:
            if exc.status == 410:
                raise Gone() from None
            raise
        self._resp = resp
        self.connected = True
        self._reached()
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                self.last_contact = time.monotonic()
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                self.resource_version = rv
                if kind == "BOOKMARK":
                    continue
                try:
                    self._on_event(str(kind), obj)
                except Exception:  # noqa: BLE001
                    log.exception("%s: handling a %s event failed", self.name, kind, extra={"fields": self._fields})
        finally:
            self.connected = False
            self._resp = None
            resp.close()  # the stream may be cut mid-way: never hand that connection back for reuse
            resp.release_conn()
        return rv


def short_error(exc: BaseException) -> str:
    """One line for a client error (urllib3's MaxRetryError repeats the whole chain otherwise)."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    exc = getattr(exc, "reason", None) or exc  # urllib3's MaxRetryError wraps the cause
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 200 else text[:197] + "..."
