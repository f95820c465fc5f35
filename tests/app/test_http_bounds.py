"""The node components' listeners (devplugin/app/http_serving.py) hold what their Bounds say and no more: a
connection that has not sent a whole request by its deadline is closed, the first request and each one after on
a kept-alive connection alike; connections past the bound from one address are closed at once while another
address is still answered, and past the bound in all the oldest connection still waiting for its request is closed
to make room; a request head that grows past its size before it ends gets 400. Small
bounds, real sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from devplugin.app.health_server import health_server
from devplugin.app.http_serving import BoundedServer, Bounds

BOUNDS = Bounds(max_connections=6, max_per_client=3, request_timeout_s=0.5, keep_alive_s=5, max_head_bytes=1024)
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: daemon\r\n\r\n"


@pytest.fixture
def server() -> Iterator[BoundedServer]:
    s = health_server(0, lambda: (True, "ok"), host="127.0.0.1", bounds=BOUNDS).start()
    yield s
    s.stop()


@pytest.fixture
def any_address() -> Iterator[BoundedServer]:
    s = health_server(0, lambda: (True, "ok"), host="0.0.0.0", bounds=BOUNDS).start()
    yield s
    s.stop()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.settimeout(3)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def answer(s: socket.socket) -> bytes:
    """One whole answer to a /healthz request (its body is 'ok\\n')."""
    data = b""
    while not data.endswith(b"ok\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `s` (None: still open after `seconds`)."""
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return None
    except OSError:  # reset
        pass
    return time.monotonic() - start


def test_a_half_sent_request_is_closed_at_its_deadline(server: BoundedServer) -> None:
    s = connect(server.port)
    s.sendall(REQUEST[:20])
    took = closed_within(s, 3)
    assert took is not None and 0.3 < took < 2.0, took
    s.close()


def test_a_silent_connection_is_closed_at_its_deadline(server: BoundedServer) -> None:
    s = connect(server.port)
    took = closed_within(s, 3)
    assert took is not None and took < 2.0, took
    s.close()


def test_a_trickled_request_does_not_reset_its_deadline(server: BoundedServer) -> None:
    s = connect(server.port)
    start = time.monotonic()
    closed = False
    for i in range(20):  # a byte every 0.1 s: uvicorn's own keep-alive timer restarts on each
        try:
            s.sendall(REQUEST[i:i + 1])
        except OSError:
            closed = True
            break
        time.sleep(0.1)
    assert closed or closed_within(s, 0.1) is not None
    assert time.monotonic() - start < 1.5
    s.close()


def test_the_next_request_on_a_kept_alive_connection_has_its_own_deadline(server: BoundedServer) -> None:
    s = connect(server.port)
    for _ in range(3):  # whole requests keep it open and are answered
        s.sendall(REQUEST)
        assert answer(s).startswith(b"HTTP/1.1 200")
        time.sleep(0.3)
    s.sendall(REQUEST[:10])
    took = closed_within(s, 3)
    assert took is not None and took < 2.0, took
    s.close()


def test_connections_past_the_bound_from_one_address_are_closed_at_once(any_address: BoundedServer) -> None:
    port = any_address.port
    held = [connect(port, "127.0.0.2") for _ in range(BOUNDS.max_per_client)]
    extra = connect(port, "127.0.0.2")
    assert closed_within(extra, 0.3) is not None  # the fourth from the same address
    other = connect(port, "127.0.0.3")  # another address is answered
    other.sendall(REQUEST)
    assert answer(other).startswith(b"HTTP/1.1 200")
    for s in held + [extra, other]:
        s.close()


def test_past_the_bound_in_all_the_oldest_waiting_connection_makes_room(any_address: BoundedServer) -> None:
    port = any_address.port
    held = []
    for i in range(BOUNDS.max_connections):  # silent connections from as many addresses (pods)
        held.append(connect(port, f"127.0.0.{10 + i}"))
        time.sleep(0.02)
    newcomer = connect(port, "127.0.0.99")  # the kubelet's probe
    newcomer.sendall(REQUEST)
    assert answer(newcomer).startswith(b"HTTP/1.1 200")
    assert closed_within(held[0], 0.3) is not None, "the oldest waiting connection stays open"
    assert all(closed_within(s, 0.05) is None for s in held[1:])
    for s in held + [newcomer]:
        s.close()


def test_a_request_head_that_grows_past_its_size_gets_400(server: BoundedServer) -> None:
    s = connect(server.port)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: daemon\r\nX-Junk: " + b"a" * 4096)  # not ended: held in memory
    data = s.recv(4096)
    assert data.startswith(b"HTTP/1.1 400"), data[:80]
    s.close()


def test_the_probes_answer_as_before() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("worker gone")

    s = health_server(0, lambda: (False, "not registered yet"), alive=broken, host="127.0.0.1",
                      metrics_port=8091).start()
    try:
        import urllib.error
        import urllib.request

        for path, code, body in (("/readyz", 503, "not registered yet\n"),
                                 ("/healthz", 503, "liveness check failed: worker gone\n"),
                                 ("/metrics", 404, "not found: use /healthz, /readyz; /metrics is on the metrics "
                                                   "port (port 8091)\n")):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://127.0.0.1:{s.port}{path}", timeout=5)
            assert (err.value.code, err.value.read().decode()) == (code, body)
            assert err.value.headers["Content-Type"] == "text/plain; charset=utf-8"
    finally:
        s.stop()
