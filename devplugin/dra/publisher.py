"""Keep this node's ResourceSlices in the apiserver equal to what the node offers (devplugin/dra/slices.py).

One pass (`sync`) reads both slices; it writes them (a new pool generation, both slices alike) when one is missing
(deleted by someone: recreated), when the node's offer changed (a GPU turned unhealthy or healthy), or when
someone else changed them since our last write. A background thread runs a pass every `interval_s` and at once
when poked (a health change). A clean stop leaves the slices in place: claims already allocated keep their
devices, and the kubelet removes a driver's slices itself when its plugin stays unregistered. `delete()` removes
them: the node left DRA mode (label) with nothing prepared.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from devplugin.dra.slices import slice_names

log = logging.getLogger(__name__)

Desired = Callable[[int], list[dict[str, object]]]  # generation -> the slices to write


def _content(objs: list[dict[str, object]]) -> str:
    """What a write says, without the generation (which changes at every write)."""
    plain = []
    for obj in objs:
        spec = dict(obj["spec"])  # type: ignore[call-overload]
        spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
        meta = obj["metadata"]
        plain.append({"name": meta["name"], "owners": meta.get("ownerReferences"), "spec": spec})  # type: ignore
    return json.dumps(plain, sort_keys=True)


def _why(exc: BaseException) -> str:
    """The apiserver's own message (an admission policy's, a validation error) when it gave one."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            message = ""
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return str(exc)


class SlicePublisher:
    """See the module docstring. `desired(generation)` builds the slices (slices.build_slices)."""

    def __init__(self, api_client: client.ApiClient, node: str, desired: Desired, interval_s: float = 30.0) -> None:
        # Any: raw answers (_preload_content=False) and plain dicts, which the client takes but does not describe
        self.api: Any = client.ResourceV1Api(api_client)
        self.node = node
        self.desired = desired
        self.interval_s = interval_s
        self.generation = 0
        self.published = threading.Event()  # both slices written or found current at least once
        self.last_error = ""
        self._written: str = ""  # _content of the last write
        self._versions: dict[str, str] = {}  # slice name -> resourceVersion after our last write
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self, name: str) -> dict | None:
        try:
            resp = self.api.read_resource_slice(name, _preload_content=False, _request_timeout=10)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        doc: dict = json.loads(resp.data)
        return doc

    def sync(self) -> bool:
        """One pass; True when the apiserver holds what the node offers. Errors are logged, never raised."""
        with self._lock:
            try:
                return self._sync()
            except (ApiException, HTTPError, OSError, ValueError) as exc:
                self.last_error = f"publishing ResourceSlices failed: {_why(exc)}"
                log.warning("%s; retrying in %.0f s", self.last_error, self.interval_s,
                            extra={"fields": {"node": self.node}})
                return False

    def _sync(self) -> bool:
        names = slice_names(self.node)
        current = {name: self._read(name) for name in names}
        wanted = self.desired(self.generation)
        content = _content(wanted)
        gens = [int(obj.get("spec", {}).get("pool", {}).get("generation", 0)) for obj in current.values() if obj]
        wanted_names = {obj["metadata"]["name"] for obj in wanted}  # type: ignore[index]
        stale = [name for name, obj in current.items() if (name in wanted_names) != (obj is not None) or (
                 obj is not None and obj["metadata"].get("resourceVersion") != self._versions.get(name))]
        if content == self._written and not stale:
            self.published.set()
            self.last_error = ""
            return True
        why = ("first publication" if not self._written else "the node's offer changed" if content != self._written
               else f"changed or deleted by someone else: {', '.join(stale)}")
        self.generation = max([self.generation, *gens]) + 1
        for obj in self.desired(self.generation):
            name = obj["metadata"]["name"]  # type: ignore[index]
            old = current.get(name)
            if old is None:
                done = self.api.create_resource_slice(obj, _preload_content=False, _request_timeout=10)
            else:
                obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]  # type: ignore[index]
                done = self.api.replace_resource_slice(name, obj, _preload_content=False, _request_timeout=10)
            self._versions[name] = json.loads(done.data)["metadata"]["resourceVersion"]
        for name, old in current.items():
            if old is not None and name not in wanted_names:  # a slice this offer no longer has
                self.api.delete_resource_slice(name, _request_timeout=10)
                self._versions.pop(name, None)
        self._written = content
        self.published.set()
        self.last_error = ""
        log.info("published ResourceSlices %s at pool generation %d (%s)", ", ".join(names), self.generation, why,
                 extra={"fields": {"node": self.node, "pool": self.node, "generation": self.generation}})
        return True

    def delete(self) -> int:
        """Remove this node's slices (the node left DRA mode); how many there were."""
        deleted = 0
        with self._lock:
            for name in slice_names(self.node):
                try:
                    self.api.delete_resource_slice(name, _request_timeout=10)
                    deleted += 1
                except ApiException as exc:
                    if exc.status != 404:
                        log.warning("cannot delete ResourceSlice %s: %s", name, _why(exc),
                                    extra={"fields": {"node": self.node}})
                except (HTTPError, OSError) as exc:
                    log.warning("cannot delete ResourceSlice %s: %s", name, exc, extra={"fields": {"node": self.node}})
            self._written, self._versions = "", {}
            self.published.clear()
        if deleted:
            log.info("deleted this node's %d ResourceSlices", deleted, extra={"fields": {"node": self.node}})
        return deleted

    def poke(self) -> None:
        self._wake.set()

    def start(self) -> SlicePublisher:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dra-slices", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sync()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
