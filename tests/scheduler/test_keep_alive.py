"""The scheduler service keeps an idle connection open longer than its callers do (the apiserver and
kube-scheduler reuse theirs for up to 90 s), so a review or a filter call sent on a connection that sat idle is
answered, never met by a connection the service is closing ("connection reset by peer" at the apiserver, which
refuses the pod when the webhook fails closed)."""

from __future__ import annotations

import http.client
import json
import time

from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.service import KEEP_ALIVE_S, server_config
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster
from tests.scheduler.test_http import review
from tests.scheduler.uvicorn_thread import serving_on_a_free_port
from tests.support.scheduler_objects import node, pod

UVICORN_DEFAULT_KEEP_ALIVE_S = 5  # what the service answered with before: the idle below outlasts it


def test_a_review_on_a_connection_idle_past_uvicorns_default_is_answered() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=2, units=16)])
    state.replace_pods([])
    config = server_config(build_app(Service(state, FakeCluster(state))), "127.0.0.1", 0)
    assert config.timeout_keep_alive == KEEP_ALIVE_S > 90  # longer than Go's http.Transport IdleConnTimeout
    body = json.dumps(review(pod(mem=4, core=30))).encode()
    with serving_on_a_free_port(config) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            for attempt in range(2):
                conn.request("POST", "/admission/validate", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                answer = json.loads(resp.read())
                assert resp.status == 200, (attempt, resp.status, answer)
                assert answer["response"]["allowed"] is True, answer
                if attempt == 0:
                    sock = conn.sock
                    time.sleep(UVICORN_DEFAULT_KEEP_ALIVE_S + 1.5)
            assert conn.sock is sock  # the same connection answered both: it was not closed while idle
        finally:
            conn.close()
