"""A uvicorn server in a thread of the test's process on a free local port: the scheduler service's tests that
need its real HTTP(S) stack (TLS, client certificates, connection limits) call it through this."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


@contextmanager
def serving_on_a_free_port(config: uvicorn.Config, start_timeout: float = 20) -> Iterator[int]:
    """Runs `config`'s server until the block ends; yields the port it listens on (127.0.0.1)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()
