"""Keep this node's ResourceSlices in the apiserver equal to what the node offers (devplugin/dra/slices.py).

This node's slices are the driver's slices whose `spec.nodeName` is this node, whatever their names: one pass
(`sync`) lists them (field selectors spec.nodeName and spec.driver) and writes the wanted ones (a new pool
generation, all alike) when one is missing (deleted by someone: recreated), when the node's offer changed (a GPU
turned unhealthy or healthy), or when someone else changed them since our last write; any other slice of this
node and driver is deleted. A slice is created under its first-tried name (`<node>-gpushare-devices`) unless that
name is taken by an object that is not this node's slice (another node's, an administrator's): then under
another name the node owns (devplugin/dra/slice_names.py), so a taken name never keeps the node from publishing.
A background thread runs a pass every `interval_s` and at once when poked (a health change). A clean stop leaves
the slices in place: claims already allocated keep their devices, and the kubelet removes a driver's slices itself
when its plugin stays unregistered. `delete()` removes them: the node left DRA mode (label) with nothing prepared.
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

from devplugin import contract
from devplugin.dra.slice_names import alternative_name, primary_of, slice_names

log = logging.getLogger(__name__)

Desired = Callable[[int], list[dict[str, object]]]  # generation -> the slices to write
NAME_TRIES = 4  # names tried for one slice: the first-tried one, then others of this node's


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
        self._names: dict[str, str] = {}  # first-tried name -> the name this node's slice has
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

    def _list(self) -> dict[str, dict]:
        """This node's slices of this driver, by name."""
        selector = f"spec.nodeName={self.node},spec.driver={contract.DRA_DRIVER}"
        resp = self.api.list_resource_slice(field_selector=selector, _preload_content=False, _request_timeout=10)
        return {item["metadata"]["name"]: item for item in json.loads(resp.data).get("items") or []}

    def _adopt(self, mine: dict[str, dict]) -> None:
        """For each first-tried name, the name this node's slice has now: the one used before while it exists,
        else the first-tried name itself, else another name of this node's found in the listing."""
        for primary in slice_names(self.node):
            if self._names.get(primary) in mine:
                continue
            owned = sorted((name for name in mine if primary_of(self.node, name) == primary),
                           key=lambda name: (name != primary, name))
            if owned:
                self._names[primary] = owned[0]
            else:
                self._names.pop(primary, None)

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
        mine = self._list()
        self._adopt(mine)
        wanted = self.desired(self.generation)
        content = _content(wanted)
        gens = [int(obj.get("spec", {}).get("pool", {}).get("generation", 0)) for obj in mine.values()]
        wanted_primaries = [obj["metadata"]["name"] for obj in wanted]  # type: ignore[index]
        keep = {self._names[p] for p in wanted_primaries if p in self._names}
        extra = sorted(name for name in mine if name not in keep)
        stale = [p for p in wanted_primaries if p not in self._names] + [
            name for name in sorted(keep) if mine[name]["metadata"].get("resourceVersion") != self._versions.get(name)]
        if content == self._written and not stale and not extra:
            self.published.set()
            self.last_error = ""
            return True
        why = ("first publication" if not self._written else "the node's offer changed" if content != self._written
               else f"changed or deleted by someone else: {', '.join(stale + extra)}")
        self.generation = max([self.generation, *gens]) + 1
        for obj in self.desired(self.generation):
            primary = obj["metadata"]["name"]  # type: ignore[index]
            name = self._names.get(primary)
            if name is None:
                name, done = self._create(primary, obj)
            else:
                obj["metadata"]["name"] = name  # type: ignore[index]
                obj["metadata"]["resourceVersion"] = mine[name]["metadata"]["resourceVersion"]  # type: ignore[index]
                done = self.api.replace_resource_slice(name, obj, _preload_content=False, _request_timeout=10)
            self._versions[name] = json.loads(done.data)["metadata"]["resourceVersion"]
        for name in extra:  # a slice this offer no longer has, or one more of this node than the offer's
            self._delete(name)
        self._written = content
        self.published.set()
        self.last_error = ""
        names = [self._names[p] for p in wanted_primaries]
        log.info("published ResourceSlices %s at pool generation %d (%s)", ", ".join(names), self.generation, why,
                 extra={"fields": {"node": self.node, "pool": self.node, "generation": self.generation}})
        return True

    def _create(self, primary: str, obj: dict[str, object]) -> tuple[str, Any]:
        """Create the slice under its first-tried name, or under another of this node's names while the name tried
        is taken; (the name it got, the apiserver's answer)."""
        name = primary
        for _ in range(NAME_TRIES):
            obj["metadata"]["name"] = name  # type: ignore[index]
            try:
                done = self.api.create_resource_slice(obj, _preload_content=False, _request_timeout=10)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                holder = self._read(name) or {}
                spec = holder.get("spec") or {}
                taken, name = name, alternative_name(primary)
                log.warning("ResourceSlice name %s is taken by a slice that is not this node's (driver %s, node %s): "
                            "publishing it as %s", taken, spec.get("driver", "?"), spec.get("nodeName", "?"), name,
                            extra={"fields": {"node": self.node, "slice": taken}})
                continue
            self._names[primary] = name
            return name, done
        raise ValueError(f"every name tried for ResourceSlice {primary} was taken ({NAME_TRIES} tries)")

    def _delete(self, name: str) -> bool:
        """Delete one of this node's slices; False when it was already gone."""
        try:
            self.api.delete_resource_slice(name, _request_timeout=10)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        finally:
            self._versions.pop(name, None)
        return True

    def delete(self) -> int:
        """Remove this node's slices (the node left DRA mode); how many there were."""
        deleted = 0
        with self._lock:
            try:
                for name in self._list():
                    deleted += self._delete(name)
            except (ApiException, HTTPError, OSError) as exc:
                log.warning("cannot delete this node's ResourceSlices: %s", _why(exc),
                            extra={"fields": {"node": self.node}})
            self._written, self._versions, self._names = "", {}, {}
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
