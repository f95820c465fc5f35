"""The state behind the fake Kubernetes apiserver: objects by resource, one resourceVersion counter, a change
history that watches read from, selectors and patches. No HTTP here (see fake_apiserver.py).

Semantics follow the real apiserver where the project depends on them: every write bumps the one global
resourceVersion; a watch from a version older than the retained history is `410 Gone`; a watch with a selector
sees an object that starts matching as ADDED and one that stops matching as DELETED.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# (group, plural) -> (kind, apiVersion, namespaced)
RESOURCES: dict[tuple[str, str], tuple[str, str, bool]] = {
    ("", "pods"): ("Pod", "v1", True),
    ("", "nodes"): ("Node", "v1", False),
    ("", "events"): ("Event", "v1", True),
    ("events.k8s.io", "events"): ("Event", "events.k8s.io/v1", True),
    ("coordination.k8s.io", "leases"): ("Lease", "coordination.k8s.io/v1", True),
}
HISTORY_LIMIT = 20000


class ApiError(Exception):
    """An error the apiserver answers with a Status body."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


@dataclass(frozen=True)
class Change:
    rv: int
    resource: tuple[str, str]
    type: str  # ADDED | MODIFIED | DELETED
    old: dict | None
    new: dict


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def lookup(obj: Mapping, dotted: str) -> str:
    """A field selector's value: missing fields read as "" (so `spec.nodeName=` matches unbound pods)."""
    cur: object = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


Selector = list[tuple[str, str, str]]  # (key, op, value), op in "=", "!=", "exists", "!exists"


def parse_selector(text: str, what: str) -> Selector:
    terms: Selector = []
    for raw in filter(None, (t.strip() for t in (text or "").split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in raw:
            key, value = raw.split("==", 1) if "==" in raw else raw.split("=", 1)
            terms.append((key.strip(), "=", value.strip()))
        elif what == "labelSelector" and " " not in raw and "(" not in raw:
            terms.append((raw[1:], "!exists", "") if raw.startswith("!") else (raw, "exists", ""))
        else:
            raise ApiError(400, "BadRequest", f"{what} term {raw!r} is not supported by this fake "
                                              "(use key=value, key!=value or key / !key)")
    return terms


def matches(obj: Mapping, fields: Selector, labels: Selector) -> bool:
    for key, op, value in fields:
        if (lookup(obj, key) == value) != (op == "="):
            return False
    obj_labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, op, value in labels:
        if op == "exists" and key not in obj_labels or op == "!exists" and key in obj_labels:
            return False
        if op in ("=", "!=") and (obj_labels.get(key) == value) != (op == "="):
            return False
    return True


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 (also used for strategic merge patches: lists are replaced, not merged by key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def merge_object(target: dict, patch: dict) -> dict:
    """merge_patch of an object by an object (always an object)."""
    out = merge_patch(target, patch)
    assert isinstance(out, dict)
    return out


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON patch path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: dict, ops: object) -> dict:
    """RFC 6902: add, remove, replace, test, copy, move."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind in ("copy", "move"):
            value = _resolve(doc, _pointer(op.get("from", "")), remove=kind == "move")
            kind, op = "add", {**op, "value": value}
        parent = _resolve(doc, parts[:-1]) if parts[:-1] else doc
        last = parts[-1]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(idx, copy.deepcopy(op.get("value")))
            elif kind == "remove":
                parent.pop(idx)
            elif kind == "replace":
                parent[idx] = copy.deepcopy(op.get("value"))
            elif kind == "test" and parent[idx] != op.get("value"):
                raise ApiError(422, "Invalid", f"JSON patch test failed at {op.get('path')}")
        elif isinstance(parent, dict):
            if kind in ("remove", "replace", "test") and last not in parent:
                raise ApiError(422, "Invalid", f"JSON patch {kind}: {op.get('path')} does not exist")
            if kind in ("add", "replace"):
                parent[last] = copy.deepcopy(op.get("value"))
            elif kind == "remove":
                del parent[last]
            elif kind == "test" and parent[last] != op.get("value"):
                raise ApiError(422, "Invalid", f"JSON patch test failed at {op.get('path')}")
        else:
            raise ApiError(422, "Invalid", f"JSON patch path {op.get('path')} has no parent object")
    return doc


def _resolve(doc: object, parts: list[str], remove: bool = False) -> object:
    cur = doc
    try:
        for i, part in enumerate(parts):
            parent = cur
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]  # type: ignore[index]
            if remove and i == len(parts) - 1:
                if isinstance(parent, list):
                    parent.pop(int(part))
                elif isinstance(parent, dict):
                    parent.pop(part)
    except (KeyError, IndexError, ValueError, TypeError):
        raise ApiError(422, "Invalid", f"JSON patch path /{'/'.join(parts)} does not exist") from None
    return cur


class Store:
    """Objects and their history; every method takes the condition's lock."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 0
        self.floor = 0  # a watch from a resourceVersion below this is 410 Gone
        self.epoch = 0  # bumped to end every open watch
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict]] = {r: {} for r in RESOURCES}
        self.history: list[Change] = []

    def _record(self, resource: tuple[str, str], kind: str, old: dict | None, new: dict) -> None:
        self.history.append(Change(self.rv, resource, kind, old, copy.deepcopy(new)))
        if len(self.history) > HISTORY_LIMIT:
            dropped = self.history[: len(self.history) // 2]
            del self.history[: len(dropped)]
            self.floor = dropped[-1].rv
        self.cond.notify_all()

    def create(self, resource: tuple[str, str], ns: str, obj: dict) -> dict:
        kind, api_version, namespaced = RESOURCES[resource]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", f"{kind}: metadata.name or metadata.generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if namespaced:
            meta["namespace"] = ns or meta.get("namespace") or "default"
        with self.cond:
            key = (meta.get("namespace", ""), meta["name"])
            if key in self.objects[resource]:
                raise ApiError(409, "AlreadyExists", f'{resource[1]} "{meta["name"]}" already exists')
            self.rv += 1
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
            meta["resourceVersion"] = str(self.rv)
            self.objects[resource][key] = obj
            self._record(resource, "ADDED", None, obj)
            return copy.deepcopy(obj)

    def get(self, resource: tuple[str, str], ns: str, name: str) -> dict:
        with self.cond:
            obj = self.objects[resource].get((ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource[1]} "{name}" not found')
            return copy.deepcopy(obj)

    def list(self, resource: tuple[str, str], ns: str, fields: Selector, labels: Selector) -> tuple[list, int]:
        with self.cond:
            items = [copy.deepcopy(o) for (o_ns, _), o in self.objects[resource].items()
                     if (not ns or o_ns == ns) and matches(o, fields, labels)]
            return items, self.rv

    def update(self, resource: tuple[str, str], ns: str, name: str, fn: Callable[[dict], dict]) -> dict:
        """Replace an object with fn(copy); keeps identity fields, checks a resourceVersion precondition."""
        with self.cond:
            old = self.objects[resource].get((ns, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{resource[1]} "{name}" not found')
            new = fn(copy.deepcopy(old))
            meta = new.setdefault("metadata", {})
            want = meta.get("resourceVersion")
            if want and want != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource[1]} "{name}": the '
                                                "object has been modified; please apply your changes to the "
                                                "latest version and try again")
            uid = meta.get("uid")
            if uid and uid != old["metadata"].get("uid"):
                raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, UID in object "
                                                f"meta: {old['metadata'].get('uid')}")
            for field in ("name", "namespace", "uid", "creationTimestamp"):
                if field in old["metadata"]:
                    meta[field] = old["metadata"][field]
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            self.objects[resource][(ns, name)] = new
            self._record(resource, "MODIFIED", old, new)
            return copy.deepcopy(new)

    def delete(self, resource: tuple[str, str], ns: str, name: str, uid: str = "") -> dict:
        with self.cond:
            old = self.objects[resource].get((ns, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{resource[1]} "{name}" not found')
            if uid and old["metadata"].get("uid") != uid:
                raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, UID in object "
                                                f"meta: {old['metadata'].get('uid')}")
            del self.objects[resource][(ns, name)]
            self.rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            self._record(resource, "DELETED", old, gone)
            return gone

    def compact(self) -> None:
        """Forget all history: every resourceVersion handed out so far is now too old to watch from."""
        with self.cond:
            self.rv += 1
            self.floor = self.rv
            self.history.clear()
            self.epoch += 1
            self.cond.notify_all()

    def close_watches(self) -> None:
        with self.cond:
            self.epoch += 1
            self.cond.notify_all()
