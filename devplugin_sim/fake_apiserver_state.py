"""What the fake apiserver answers from and keeps while it runs, shared by its two sides: the fake a test holds
(fake_apiserver.py: sets the faults, reads the requests) and its HTTP side (fake_apiserver_http.py: answers from
the store, records each request and open connection). The store, the faults in force (down mode, delay before each
answer), the requests seen and the connections open."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

from devplugin_sim.fake_apiserver_store import Store


@dataclass(frozen=True)
class Request:
    """One request as the fake saw it."""

    method: str
    path: str
    query: dict[str, str]

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


class ServedState:
    """The store and the faults the HTTP side answers with, and what it records."""

    def __init__(self, bookmark_interval_s: float) -> None:
        self.store = Store()
        self.bookmark_interval_s = bookmark_interval_s
        self.requests: list[Request] = []
        self.down_mode = ""  # "", or a fault of FakeApiserver.down(); "stopped" once stopped
        self.delay_s = 0.0  # slept before each answer
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def log(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def connections(self) -> list[socket.socket]:
        with self._lock:
            return list(self._conns)

    def requests_matching(self, method: str, path_suffix: str, watch: bool | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.endswith(path_suffix)
                    and (watch is None or r.watch == watch)]
