"""The node components' HTTP listeners (probes, metrics): uvicorn serving an ASGI app on a thread of its own, with
what a port any pod can reach needs on top of uvicorn.

uvicorn answers every connection on one event loop (no thread per connection), and with `limit_concurrency` it
answers 503 once a request has arrived. Two things it leaves open: a connection that never finishes its request
is held for as long as its client likes (the keep-alive timer only runs between requests, and each byte received
stops it), and connections beyond the limit are still accepted and held until they send a whole request. So here
(Bounds):
- each connection gets `request_timeout_s` to send a whole request, from the moment it opens or its previous
  answer was sent, else it is closed;
- at most `max_per_client` are open from one address (a pod): more are closed at once;
- at most `max_connections` are open in all: a new one closes the oldest that is still waiting for its request
  (idle or half-sent), so a flood of connections that send nothing churns among themselves while a client that
  sends its request at once (the kubelet's probe, a scrape) is answered; when every open one is being answered,
  the new one is closed;
- a request head that grows past `max_head_bytes` before it ends gets 400 from h11.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import h11

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class Bounds:
    """What one listener holds at most. The kubelet's probe opens one connection per probe (no keep-alive) and
    sends its request in one packet; Prometheus keeps one connection per target."""

    max_connections: int = 64  # open at once, all clients
    max_per_client: int = 8  # open at once from one address (a pod)
    request_timeout_s: float = 5.0  # to send a whole request, from connect or from the previous answer
    keep_alive_s: int = 5  # an idle kept-alive connection is closed after this
    max_head_bytes: int = 8192  # request line and headers, while they have not ended


DEFAULT_BOUNDS = Bounds()


class Tracked(Protocol):
    """What the gate needs of a connection: its client's address, whether it is waiting for a request, and a way
    to drop it."""

    client_address: str

    def waiting(self) -> bool: ...

    def drop(self) -> None: ...


class ConnectionGate:
    """The connections open now, oldest first (a connection moves to the end when it starts a new request cycle),
    and their count per client address. Called on the server's event loop only."""

    def __init__(self, bounds: Bounds, name: str) -> None:
        self.bounds = bounds
        self.name = name
        self.open: dict[Tracked, None] = {}
        self.by_client: dict[str, int] = {}
        self.refused = 0
        self.evicted = 0
        self._warned_at = 0.0

    def admit(self, conn: Tracked) -> bool:
        client = conn.client_address
        if self.by_client.get(client, 0) >= self.bounds.max_per_client:
            return self._refuse(client, f"{self.bounds.max_per_client} open from this address")
        if len(self.open) >= self.bounds.max_connections:
            victim = next((c for c in self.open if c.waiting()), None)
            if victim is None:
                return self._refuse(client, f"{self.bounds.max_connections} open, all being answered")
            self.release(victim)
            victim.drop()
            self.evicted += 1
        self.open[conn] = None
        self.by_client[client] = self.by_client.get(client, 0) + 1
        return True

    def release(self, conn: Tracked) -> None:
        """Forget a connection (closed, or dropped to make room); a second call does nothing."""
        if self.open.pop(conn, False) is False:
            return
        left = self.by_client.get(conn.client_address, 0) - 1
        if left > 0:
            self.by_client[conn.client_address] = left
        else:
            self.by_client.pop(conn.client_address, None)

    def renewed(self, conn: Tracked) -> None:
        """A connection starts waiting for its next request: it is the youngest again."""
        if conn in self.open:
            del self.open[conn]
            self.open[conn] = None

    def _refuse(self, client: str, why: str) -> bool:
        self.refused += 1
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s: connection from %s closed at once (%s); %d refused and %d waiting ones closed to make "
                        "room so far", self.name, client, why, self.refused, self.evicted,
                        extra={"fields": {"listener": self.name, "client": client, "open": len(self.open),
                                          "refused": self.refused, "evicted": self.evicted}})
        return False


def _client(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"


def bounded_protocol(base: type, gate: ConnectionGate, idle_kept_alive: bool = False) -> type:
    """A subclass of uvicorn's h11 protocol class that admits connections through `gate` and closes one that has
    not sent a whole request within the gate's request_timeout_s: from the moment it opened, and for the next
    requests from the moment the previous answer was sent or, with `idle_kept_alive`, from the first byte of the
    next request (an idle kept-alive connection is then closed by uvicorn's keep-alive timer alone: callers that
    reuse idle connections for longer than request_timeout_s must not race a close, see the scheduler service)."""
    timeout = gate.bounds.request_timeout_s

    class Bounded(base):
        client_address = ""
        _admitted = False
        _deadline: asyncio.TimerHandle | None = None
        _between = False  # idle_kept_alive: answered, the next request's first byte not here yet

        def connection_made(self, transport: asyncio.Transport) -> None:
            self.client_address = _client(transport)
            if not gate.admit(self):
                transport.abort()
                return
            self._admitted = True
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if not self._admitted:
                return
            self._admitted = False
            gate.release(self)
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            gate.renewed(self)
            if not idle_kept_alive:
                self._arm()  # the next request on a kept-alive connection has its own deadline
                return
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self._between = True

        def data_received(self, data: bytes) -> None:
            if self._between:  # the next request begins: its deadline runs from here
                self._between = False
                self._arm()
            super().data_received(data)

        def waiting(self) -> bool:
            # IDLE: no whole request head yet (or idle between requests); SEND_BODY: its body is not all there.
            # DONE and later: being answered.
            return bool(self.conn.their_state in (h11.IDLE, h11.SEND_BODY))

        def drop(self) -> None:
            if not self.transport.is_closing():
                self.transport.abort()

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(timeout, self._expire)

        def _expire(self) -> None:
            if self.waiting() and not self.transport.is_closing():
                log.debug("request not sent within %.1f s: connection closed", timeout,
                          extra={"fields": {"listener": gate.name, "client": self.client_address}})
                self.transport.close()

    Bounded.__name__ = f"Bounded{base.__name__}"
    return Bounded


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one); OSError names the address when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _quiet_server(base: type) -> type:
    """uvicorn's Server without its main loop's tick (it wakes ten times a second to refresh the Date header and
    look for should_exit): a node component's listener sends no Date header and sleeps until stop() wakes it."""

    class Quiet(base):
        _loop: asyncio.AbstractEventLoop | None = None
        _stopping: asyncio.Event | None = None

        async def main_loop(self) -> None:
            self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
            await self.on_tick(0)  # once: the default headers
            if not self.should_exit:
                await self._stopping.wait()

        def wake(self) -> None:
            loop, stopping = self._loop, self._stopping
            if loop is not None and stopping is not None and not loop.is_closed():
                loop.call_soon_threadsafe(stopping.set)

    return Quiet


class BoundedServer:
    """`app` (ASGI) on host:port, served by uvicorn on its own thread and event loop until stop(); `.port` is the
    port bound (0 picks a free one)."""

    def __init__(self, app: Any, host: str, port: int, name: str, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        import uvicorn

        self.name = name
        self.host = host
        self._sock = listen(host, port)
        self.port = int(self._sock.getsockname()[1])
        self.gate = ConnectionGate(bounds, name)
        config = uvicorn.Config(app, http="h11", log_config=None, access_log=False, lifespan="off",
                                timeout_keep_alive=bounds.keep_alive_s, timeout_graceful_shutdown=2,
                                h11_max_incomplete_event_size=bounds.max_head_bytes, backlog=128,
                                server_header=False, date_header=False)
        config.load()
        config.http_protocol_class = bounded_protocol(config.http_protocol_class, self.gate)
        self._server = _quiet_server(uvicorn.Server)(config)
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"http-{name}", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # noqa: BLE001 - reported by start() or logged: the daemon goes on
            self._failed = exc
            log.exception("%s: HTTP listener stopped", self.name, extra={"fields": {"listener": self.name}})

    def start(self) -> BoundedServer:
        """Serve; returns once uvicorn accepts connections (RuntimeError if it could not start)."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if self._failed is not None or not self._thread.is_alive() or time.monotonic() > deadline:
                self._sock.close()
                raise RuntimeError(f"{self.name}: the HTTP listener on {self.host}:{self.port} did not start: "
                                   f"{self._failed or 'no answer within 10 s'}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._server.force_exit = True
        self._server.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()
