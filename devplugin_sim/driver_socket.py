"""The node's driver socket for the fake NVIDIA driver: tells a process in a container its host pid, and whether a
host pid is alive (fakes/README.md, "The driver socket").

A real driver knows host pids; the fake runs inside the process, where getpid() is the container's own numbering.
A config with `driver_socket=PATH` makes the fake ask this server instead. Line protocol on a unix stream socket,
one or more requests per connection, each answered before the next is read:

    pid\\n          -> <the peer's pid in this server's PID namespace>\\n   (SO_PEERCRED of the connection)
    alive <pid>\\n  -> 1\\n or 0\\n                                          (kill(pid, 0) here)
    anything else  -> error <what was wrong>\\n

The server must run in the host's PID namespace: the kernel translates SO_PEERCRED's pid into the namespace of
the process that reads it. The node's container runtime serves the same protocol; this one is for tests and the
demo.
"""

from __future__ import annotations

import os
import socket
import socketserver
import struct
import threading
from pathlib import Path

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a unix socket, in this process's PID namespace."""
    pid, _, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(pid)


def pid_alive(pid: int) -> bool:
    """kill(pid, 0): the process exists (a process of another user counts too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def answer(request: str, peer: int) -> str:
    """The answer line (without its newline) to one request line from the process `peer`."""
    words = request.split()
    if words == ["pid"]:
        return str(peer)
    if len(words) == 2 and words[0] == "alive" and words[1].isdigit():
        return "1" if pid_alive(int(words[1])) else "0"
    return f"error unknown request {request[:60]!r}: expected 'pid' or 'alive <pid>'"


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        peer = peer_pid(self.request)
        for raw in self.rfile:
            line = raw.decode(errors="replace").rstrip("\n")
            self.server.record(line, peer)
            self.wfile.write((answer(line, peer) + "\n").encode())
            self.wfile.flush()


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        super().__init__(path, _Handler)
        self.lock = threading.Lock()
        self.requests: list[tuple[int, str]] = []

    def record(self, line: str, peer: int) -> None:
        with self.lock:
            self.requests.append((peer, line))


class DriverSocket:
    """A driver socket served on a thread: `with DriverSocket(path) as sock: ...`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if len(str(self.path)) > 107:
            raise ValueError(f"a unix socket path has at most 107 characters; {self.path} has {len(str(self.path))}")
        self.path.unlink(missing_ok=True)
        self._server = _Server(str(self.path))
        self.path.chmod(0o666)  # every container's processes (any uid) reach it, as /dev/nvidiactl is world-writable
        self._thread = threading.Thread(target=self._server.serve_forever, name="driver-socket", daemon=True)
        self._thread.start()

    def requests(self) -> list[tuple[int, str]]:
        """(peer host pid, request line) of every request served so far, oldest first."""
        with self._server.lock:
            return list(self._server.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> DriverSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
