"""The HTTP side of the fake Kubernetes apiserver: routing, verbs, binding, watch streams (see fake_apiserver.py)."""

from __future__ import annotations

import bisect
import copy
import json
import socket
import struct
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from devplugin_sim.fake_apiserver_state import Request, ServedState
from devplugin_sim.fake_apiserver_store import (
    RESOURCES,
    ApiError,
    Change,
    json_patch,
    matches,
    merge_object,
    parse_selector,
)

PODS, NODES, EVENTS = ("", "pods"), ("", "nodes"), ("", "events")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: ServedState) -> None:
        self.state = state
        super().__init__(("127.0.0.1", 0), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # cut connections are the point of down()
            super().handle_error(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        if self.state.down_mode == "reset":
            request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            request.close()
            return
        super().process_request(request, client_address)


def _is_token_request(path: str) -> bool:
    parts = path.split("/")
    return (len(parts) == 8 and parts[1:4] == ["api", "v1", "namespaces"] and parts[5] == "serviceaccounts"
            and parts[7] == "token")


def _route(path: str) -> tuple[tuple[str, str], str, str, str]:
    """(resource, namespace, name, subresource) of a path; ApiError 404 for anything else."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis" and parts[2] == "v1":
        group, rest = parts[1], parts[3:]
    else:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    ns = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        ns, rest = rest[1], rest[2:]
    if rest and rest[0] == "bindings" and group == "" and ns and len(rest) == 1:
        return PODS, ns, "", "bindings"
    key = (group, rest[0]) if rest else ("", "")
    namespaced = key in RESOURCES and RESOURCES[key][2]
    if key not in RESOURCES or len(rest) > 3 or (ns and not namespaced) or (namespaced and not ns and len(rest) > 1):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if sub and (sub, key) not in (("binding", PODS), ("status", PODS), ("status", NODES)):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    return key, ns, name, sub


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle + delayed ACK add ~40 ms a response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.state.track(self.connection, True)

    def finish(self) -> None:
        self.server.state.track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        state = self.server.state
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        req = Request(method, url.path, query)
        state.log(req)
        body: Any = None
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                return self._send(400, {**ApiError(400, "BadRequest", "body is not JSON").status()})
        if state.delay_s:
            time.sleep(state.delay_s)
        if state.down_mode == "503":
            return self._send(503, ApiError(503, "ServiceUnavailable", "the apiserver is unavailable").status())
        try:
            if url.path in ("/healthz", "/readyz", "/livez"):
                return self._send_text(200, "ok")
            if method == "GET" and "/proxy/" in url.path:
                return self._proxy(url.path)
            if method == "POST" and _is_token_request(url.path):
                return self._token(url.path)
            self._dispatch(method, url.path, query, body)
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._send(400, ApiError(400, "BadRequest", f"bad request: {exc!r}").status())

    def _dispatch(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
        store = self.server.state.store
        resource, ns, name, sub = _route(path)
        if sub in ("binding", "bindings"):
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
            return self._bind(ns, name or ((body or {}).get("metadata") or {}).get("name", ""), body or {})
        if method == "GET" and not name:
            fields = parse_selector(query.get("fieldSelector", ""), "fieldSelector")
            labels = parse_selector(query.get("labelSelector", ""), "labelSelector")
            if query.get("watch") in ("true", "1"):
                return self._watch(resource, ns, fields, labels, query)
            items, rv = store.list(resource, ns, fields, labels)
            kind, api_version, _ = RESOURCES[resource]
            return self._send(200, {"kind": kind + "List", "apiVersion": api_version,
                                    "metadata": {"resourceVersion": str(rv)}, "items": items})
        if method == "GET":
            return self._send(200, store.get(resource, ns, name))
        if method == "POST" and not name:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "POST needs a JSON object body")
            return self._send(201, store.create(resource, ns, body))
        if method == "PUT" and name:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "PUT needs a JSON object body")
            return self._send(200, store.update(resource, ns, name, lambda _old: copy.deepcopy(body)))
        if method == "PATCH" and name:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype == "application/json-patch+json":
                return self._send(200, store.update(resource, ns, name, lambda old: json_patch(old, body)))
            if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", f"a {ctype} body must be a JSON object")
                return self._send(200, store.update(resource, ns, name, lambda old: merge_object(old, body)))
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
        if method == "DELETE" and name:
            uid = (((body or {}).get("preconditions")) or {}).get("uid", "")
            return self._send(200, store.delete(resource, ns, name, uid))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")

    def _proxy(self, path: str) -> None:
        """GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH: the pod's status.podIP and PORT (a number, as the
        real apiserver takes it), like the apiserver's pod proxy; 503 when the pod does not answer."""
        parts = path.split("/", 8)
        if len(parts) < 8 or parts[1:4] != ["api", "v1", "namespaces"] or parts[5] != "pods" or parts[7] != "proxy":
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        name, _, port = unquote(parts[6]).partition(":")
        pod = self.server.state.store.get(PODS, parts[4], name)
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or not port.isdigit():
            raise ApiError(503, "ServiceUnavailable", f"pod {name} has no IP, or port {port!r} is not a number")
        # like the real proxy: the caller's Authorization is not passed on (the apiserver consumed it), other
        # headers are
        passed = {k: v for k, v in self.headers.items() if k.lower() not in ("authorization", "host", "connection")}
        target = urllib.request.Request(f"http://{ip}:{port}/{parts[8] if len(parts) > 8 else ''}", headers=passed)
        try:
            with urllib.request.urlopen(target, timeout=10) as r:
                return self._send_text(r.status, r.read().decode())
        except urllib.error.HTTPError as exc:
            return self._send_text(exc.code, exc.read().decode())
        except OSError as exc:
            raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: {exc}") from None

    def _token(self, path: str) -> None:
        """POST /api/v1/namespaces/NS/serviceaccounts/NAME/token (TokenRequest): a token naming the ServiceAccount,
        `fake-token:NS:NAME` (FakeApiserver.token_user reads it back, for a TokenReview in tests)."""
        parts = path.split("/")
        ns, name = parts[4], parts[6]
        self._send(201, {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                         "metadata": {"name": name, "namespace": ns},
                         "status": {"token": f"fake-token:{ns}:{name}", "expirationTimestamp": "2099-01-01T00:00:00Z"}})

    def _bind(self, ns: str, name: str, body: dict) -> None:
        target = (body.get("target") or {}).get("name")
        if not target:
            raise ApiError(422, "Invalid", "Binding: target.name is required")
        meta = body.get("metadata") or {}

        def bind(pod: dict) -> dict:
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound:
                raise ApiError(409, "Conflict", f"pod {name} is already assigned to node \"{bound}\"")
            if meta.get("uid") and meta["uid"] != pod["metadata"].get("uid"):
                raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {meta['uid']}")
            pod["spec"]["nodeName"] = target
            pod["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
            pod["metadata"].pop("resourceVersion", None)
            return pod

        self.server.state.store.update(PODS, ns, name, bind)
        self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    # --- watch ----------------------------------------------------------------------------------------------------
    def _watch(self, resource: tuple[str, str], ns: str, fields: list, labels: list, query: dict[str, str]) -> None:
        state = self.server.state
        store = state.store
        timeout = float(query.get("timeoutSeconds") or 0) or 3600.0
        deadline = time.monotonic() + timeout
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        kind, api_version, _ = RESOURCES[resource]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        want = query.get("resourceVersion", "")
        with store.cond:
            epoch = store.epoch
            if want in ("", "0"):
                last = store.rv
                initial = [o for (o_ns, _), o in store.objects[resource].items()
                           if (not ns or o_ns == ns) and matches(o, fields, labels)]
                lines = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in initial]
            else:
                last, lines = int(want), []
        try:
            for line in lines:
                self._chunk(line)
            next_bookmark = time.monotonic() + state.bookmark_interval_s
            gone = None
            while True:
                with store.cond:
                    while store.rv <= last and store.epoch == epoch and last >= store.floor:
                        wake = min(deadline, next_bookmark) if bookmarks else deadline
                        if time.monotonic() >= wake:
                            break
                        store.cond.wait(wake - time.monotonic())
                    if last < store.floor:
                        gone = ApiError(410, "Expired", f"too old resource version: {last} ({store.floor})")
                        break
                    if store.epoch != epoch or time.monotonic() >= deadline:
                        break
                    start = bisect.bisect_right(store.history, last, key=lambda c: c.rv)
                    changes = [c for c in store.history[start:] if c.resource == resource]
                    last = store.rv
                for change in changes:
                    event = _translate(change, ns, fields, labels)
                    if event:
                        self._chunk(event)
                if bookmarks and time.monotonic() >= next_bookmark:
                    self._chunk({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                                                                "metadata": {"resourceVersion": str(last)}}})
                    next_bookmark = time.monotonic() + state.bookmark_interval_s
            if gone is not None:
                self._chunk({"type": "ERROR", "object": gone.status()})
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _chunk(self, event: dict) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _send(self, code: int, obj: dict) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _translate(change: Change, ns: str, fields: list, labels: list) -> dict | None:
    """The watch event one watcher sees for a change, given its namespace and selectors."""
    def sees(obj: dict | None) -> bool:
        return obj is not None and (not ns or obj["metadata"].get("namespace") == ns) and matches(obj, fields, labels)

    before, after = sees(change.old), sees(change.new)
    if change.type == "DELETED":
        return {"type": "DELETED", "object": change.new} if before else None
    if before and after:
        return {"type": "MODIFIED", "object": change.new}
    if after:
        return {"type": "ADDED", "object": change.new}
    if before:
        return {"type": "DELETED", "object": change.new}
    return None
