"""The scheduler service holds what a caller on the cluster's network can make it hold within bounds: a connection
that sends half a request, or nothing, is closed once its deadline passes; one address cannot hold more than its
share of connections; a flood from many addresses churns among itself; and the apiserver's review is answered all
along. An idle kept-alive connection is still kept past the request deadline (its callers reuse idle connections
for up to 90 s: tests/scheduler/test_keep_alive.py)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from devplugin.app.http_serving import Bounds
from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.service import KEEP_ALIVE_S, SERVICE_BOUNDS, server_config
from devplugin.scheduler.state import ClusterState
from tests.app.test_node_http_flood import HALF_SENT, closed_by_peer, half_sent
from tests.scheduler.test_extender import FakeCluster
from tests.scheduler.test_http import review
from tests.scheduler.uvicorn_thread import serving_on_a_free_port
from tests.support.daemon_harness import _until
from tests.support.scheduler_objects import node, pod

SMALL = Bounds(max_connections=16, max_per_client=4, request_timeout_s=1.0, keep_alive_s=KEEP_ALIVE_S,
               max_head_bytes=16384)
SLACK_S = 4.0  # on top of a deadline, for a loaded machine
BODY = json.dumps(review(pod(mem=4, core=30))).encode()


@contextmanager
def service(bounds: Bounds = SMALL) -> Iterator[int]:
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=2, units=16)])
    state.replace_pods([])
    with serving_on_a_free_port(server_config(build_app(Service(state, FakeCluster(state))), "127.0.0.1", 0,
                                              bounds=bounds)) as port:
        yield port


def reviewed(conn: http.client.HTTPConnection) -> bool:
    conn.request("POST", "/admission/validate", BODY, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status == 200 and json.loads(resp.read())["response"]["allowed"] is True


def review_answered(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        return reviewed(conn)
    finally:
        conn.close()


def silent(source: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def test_the_shipped_bounds_leave_room_for_the_control_plane() -> None:
    assert SERVICE_BOUNDS.keep_alive_s == KEEP_ALIVE_S > 90  # longer than the callers keep theirs
    assert SERVICE_BOUNDS.max_per_client >= 128  # an apiserver opens a connection per concurrent review
    assert SERVICE_BOUNDS.max_connections >= 4 * SERVICE_BOUNDS.max_per_client  # a few control-plane nodes


def test_half_sent_and_silent_connections_are_closed_at_their_deadline_and_idle_kept_alive_ones_are_kept() -> None:
    with service() as port:
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert reviewed(kept)
        opened = time.monotonic()
        half = half_sent("127.0.0.2", port, 1)
        quiet = [silent("127.0.0.3", port)]
        # a kept-alive connection that starts its next request and stops: that request's deadline runs from its
        # first byte
        started = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert reviewed(started)
        assert started.sock is not None
        started.sock.sendall(HALF_SENT)
        held = half + quiet + [started.sock]
        try:
            assert _until(lambda: all(closed_by_peer(s) for s in held), SMALL.request_timeout_s + SLACK_S), \
                "a connection that sent no whole request is held past its deadline"
            assert time.monotonic() - opened >= SMALL.request_timeout_s - 0.1, "closed before the deadline"
            time.sleep(0.5)  # the kept one has been idle past the request deadline
            sock = kept.sock
            assert reviewed(kept) and kept.sock is sock, "an idle kept-alive connection was closed"
        finally:
            for s in held:
                s.close()
            kept.close()


def test_connections_past_one_addresss_share_are_closed_and_the_apiserver_is_answered() -> None:
    with service() as port:
        mine = [silent("127.0.0.2", port) for _ in range(3 * SMALL.max_per_client)]
        try:
            assert _until(lambda: sum(closed_by_peer(s) for s in mine) >= len(mine) - SMALL.max_per_client, 3), \
                "one address holds more connections than its share"
            assert sum(not closed_by_peer(s) for s in mine) == SMALL.max_per_client
            assert review_answered(port)
        finally:
            for s in mine:
                s.close()


def test_a_flood_from_many_addresses_churns_among_itself_and_reviews_are_answered() -> None:
    with service() as port:
        flood: list[socket.socket] = []
        try:
            for i in range(3 * SMALL.max_connections // SMALL.max_per_client):
                flood += [silent(f"127.0.1.{i + 1}", port) for _ in range(SMALL.max_per_client)]
            assert _until(lambda: sum(not closed_by_peer(s) for s in flood) <= SMALL.max_connections, 3)
            # each review takes the place of the oldest connection still waiting for its request
            assert [review_answered(port) for _ in range(5)] == [True] * 5
        finally:
            for s in flood:
                s.close()
        assert review_answered(port)
