"""A gRPC server on a unix socket that it owns (replaces a stale file; removes only its own at stop)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

AddServicer = Callable[[grpc.Server], None]


class SocketServer:
    """Serves what `add` puts on a server at `path`; restartable."""

    def __init__(self, path: Path, add: AddServicer, name: str, workers: int = 8,
                 fields: dict[str, str] | None = None, grace_s: float = 0.5) -> None:
        self.path = Path(path)
        self.add = add
        self.name = name
        self.workers = workers
        self.fields = fields or {}  # what the log lines name besides the socket (a resource, a driver)
        self.grace_s = grace_s
        self._server: grpc.Server | None = None
        self._inode: int | None = None
        self.starts = 0  # how many times a socket was made (a re-registration makes a new one)

    def start(self) -> SocketServer:
        self.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name))
        self.add(server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        self._inode = os.stat(self.path).st_ino
        self.starts += 1
        log.info("serving %s on %s", self.name, self.path,
                 extra={"fields": {**self.fields, "socket": str(self.path)}})
        return self

    def serving(self) -> bool:
        """True while our socket file is in place."""
        return self._server is not None and self._socket_is_ours()

    def stop(self, grace_s: float | None = None) -> None:
        if self._server is None:
            return
        self._server.stop(self.grace_s if grace_s is None else grace_s).wait()
        self._server = None
        if self._socket_is_ours():
            self.path.unlink()
        self._inode = None

    def _socket_is_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            return False
