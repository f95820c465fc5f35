"""Leader election on a Lease (fake apiserver): one leader among replicas; a stopped leader releases the Lease and
the next takes it at its next try; a killed one (no release) is replaced once the lease runs out; followers answer
the verbs 503 and are not Ready, so the Service routes to the leader."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from kubernetes import client

from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.leader import LeaderElector
from devplugin.scheduler.state import ClusterState
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.scheduler.test_cluster import wait_for
from tests.support.scheduler_objects import node, pod

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


@pytest.fixture()
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver() as fake:
        yield fake


def elector(api: FakeApiserver, who: str) -> LeaderElector:
    return LeaderElector(api.client(), "kube-system", "devplugin-scheduler", who, lease_s=1.5,
                         renew_deadline_s=1.0, retry_s=0.1)


def test_one_leader_a_released_lease_passes_at_once_a_dead_leader_after_the_lease(api: FakeApiserver) -> None:
    a, b, c = elector(api, "a").start(), elector(api, "b").start(), elector(api, "c").start()
    try:
        wait_for(lambda: [e.is_leader() for e in (a, b, c)].count(True) == 1, timeout=10, what="one leader")
        first = next(e for e in (a, b, c) if e.is_leader())
        rest = [e for e in (a, b, c) if e is not first]
        wait_for(lambda: all(e.leader() == first.identity for e in rest), what="followers see the leader")
        first.stop(release=True)
        wait_for(lambda: [e.is_leader() for e in rest].count(True) == 1, timeout=5, what="a new leader")
        second = next(e for e in rest if e.is_leader())
        third = next(e for e in rest if e is not second)
        second.stop(release=False)  # killed: nobody releases; the lease must run out first
        assert not second.is_leader()
        wait_for(third.is_leader, timeout=5, what="the last replica to lead")
        lease = client.CoordinationV1Api(api.client()).read_namespaced_lease("devplugin-scheduler", "kube-system")
        assert lease.spec.holder_identity == third.identity and lease.spec.lease_transitions == 2
        assert [e.is_leader() for e in (a, b, c)].count(True) == 1
    finally:
        for e in (a, b, c):
            e.stop(release=False)


def test_a_leader_that_cannot_renew_steps_down_before_its_lease_runs_out(api: FakeApiserver) -> None:
    e = elector(api, "solo").start()
    try:
        wait_for(e.is_leader, what="leading")
        api.down()
        wait_for(lambda: not e.is_leader(), timeout=3, what="stepping down")  # within the 1 s renew deadline
        api.up()
        wait_for(e.is_leader, timeout=5, what="leading again")
    finally:
        e.stop()


def test_followers_answer_the_verbs_503_and_are_not_ready() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1")])
    state.replace_pods([])
    leading = {"now": False}
    svc = Service(state, None, is_leader=lambda: leading["now"], leader_name=lambda: "replica-a")
    http = TestClient(build_app(svc))
    r = http.post("/scheduler/filter", json={"Pod": pod(mem=1), "NodeNames": ["n1"]})
    assert r.status_code == 503 and r.json()["error"].startswith("this replica is not the leader (leader: replica-a)")
    ready = http.get("/readyz")
    assert ready.status_code == 503 and ready.text == "not the leader (leader: replica-a)"
    leading["now"] = True
    assert http.get("/readyz").status_code == 200
    assert http.post("/scheduler/filter", json={"Pod": pod(mem=1), "NodeNames": ["n1"]}).json()["NodeNames"] == ["n1"]
