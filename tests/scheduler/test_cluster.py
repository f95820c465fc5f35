"""The extender against the fake apiserver with the real kubernetes client: informers build the state, bind
creates the Binding carrying the GPU choice, the watch confirms it, a 410 relists, a restart rebuilds."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from devplugin.contract import ANN_ALIYUN_MEM_IDX, ANN_SCHEDULED, GpuUsage, NodeUsage, parse_assignment
from devplugin.scheduler.cluster import KubeCluster
from devplugin.scheduler.extender import BindError, filter_nodes
from devplugin.scheduler.informer import Informer, start_informers
from devplugin.scheduler.state import ClusterState
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.support.scheduler_objects import MEM, bind, node


def wait_for(check: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def add_gpu_node(api: FakeApiserver, name: str, **kw: object) -> None:
    obj = node(name, **kw)  # type: ignore[arg-type]
    api.add_node(name, labels=obj["metadata"]["labels"], annotations=obj["metadata"]["annotations"])


@pytest.fixture()
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver(bookmark_interval_s=0.2) as fake:
        yield fake


@contextmanager
def run_extender(api: FakeApiserver) -> Iterator[tuple[ClusterState, list[Informer], KubeCluster]]:
    """The extender's state fed by informers from `api` (first lists in); the informers stop on leaving."""
    state = ClusterState()
    client = api.client()
    informers = start_informers(client, state, watch_timeout_s=5, retry_s=0.1)
    try:
        wait_for(lambda: state.nodes_synced.is_set() and state.pods_synced.is_set(), what="first lists")
        yield state, informers, KubeCluster(client)
    finally:
        for inf in informers:
            inf.stop()


def used(state: ClusterState, name: str) -> list[int]:
    view = state.view(name)
    return [g.mem_used for g in view.gpus] if view else []


def test_bind_writes_the_choice_with_the_binding_and_the_watch_confirms_it(api: FakeApiserver) -> None:
    add_gpu_node(api, "n1", gpus=2, units=16)
    with run_extender(api) as (state, informers, cluster):
        p = api.add_pod(name="train", limits={MEM: 10})
        wait_for(lambda: state.pod("default", "train"), what="pod in the cache")
        bind(state, cluster, "default", "train", p["metadata"]["uid"], "n1")
        stored = api.pod("default", "train")
        assert stored["spec"]["nodeName"] == "n1"
        chosen = parse_assignment(stored["metadata"]["annotations"][ANN_SCHEDULED])
        assert [(s.index, s.mem) for s in chosen.containers["main"]] == [(0, 10)]
        assert stored["metadata"]["annotations"][ANN_ALIYUN_MEM_IDX] == "0"
        wait_for(lambda: not state.held(p["metadata"]["uid"]).assumed, what="the watch to show the bound pod")
        assert used(state, "n1") == [10, 0]
        assert [inf.relists for inf in informers] == [1, 1]  # changes came through the watches
        # The Binding needs the same pod: a re-created one (new uid) is refused, and the room is not kept.
        q = api.add_pod(name="q", limits={MEM: 4})
        wait_for(lambda: state.pod("default", "q"), what="pod q")
        api.delete_pod("default", "q")
        api.add_pod(name="q", limits={MEM: 4})
        with pytest.raises(BindError):
            bind(state, cluster, "default", "q", q["metadata"]["uid"], "n1")
        assert used(state, "n1") == [10, 0]


def test_room_follows_pod_phases_and_node_usage(api: FakeApiserver) -> None:
    add_gpu_node(api, "n1", gpus=1, units=16)
    with run_extender(api) as (state, informers, cluster):
        p = api.add_pod(name="a", limits={MEM: 12})
        wait_for(lambda: state.pod("default", "a"))
        bind(state, cluster, "default", "a", p["metadata"]["uid"], "n1")
        api.set_pod_phase("default", "a", "Running")
        probe = {"metadata": {"name": "probe", "namespace": "default", "uid": "x"},
                 "spec": {"containers": [{"name": "c", "resources": {"limits": {MEM: "8"}}}]}}
        assert filter_nodes(state, probe, ["n1"]).failed
        api.set_pod_phase("default", "a", "Succeeded")
        wait_for(lambda: filter_nodes(state, probe, ["n1"]).passed == ["n1"], what="room freed by the finished pod")
        # A pod the daemon placed without annotations shows only in the node's usage annotation.
        api.patch_node("n1", {"metadata": {"annotations": {
            "gpushare.io/gpu-usage": NodeUsage({0: GpuUsage(mem=10, containers=1)}).render()}}})
        wait_for(lambda: filter_nodes(state, probe, ["n1"]).failed, what="usage annotation counted")


def test_an_expired_watch_relists_and_a_restart_rebuilds_the_same_state(api: FakeApiserver) -> None:
    add_gpu_node(api, "n1", gpus=2, units=16)
    with run_extender(api) as (state, informers, cluster):
        for i, mem in enumerate((6, 6, 12)):
            p = api.add_pod(name=f"p{i}", limits={MEM: mem})
            wait_for(lambda i=i: state.pod("default", f"p{i}"))
            bind(state, cluster, "default", f"p{i}", p["metadata"]["uid"], "n1")
        wait_for(lambda: all(not h.assumed for h in state.pods_on("n1")), what="binds confirmed")
        before = used(state, "n1")
        assert before == [12, 12]
        relists = informers[1].relists
        api.compact()
        api.add_pod(name="late", node_name="n1", limits={MEM: 4}, phase="Running",
                    annotations={ANN_ALIYUN_MEM_IDX: "1"})
        wait_for(lambda: informers[1].relists > relists, what="relist after 410")
        wait_for(lambda: used(state, "n1") == [12, 16], what="the pod created meanwhile")
    with run_extender(api) as (restarted, informers, _):
        assert used(restarted, "n1") == [12, 16]


def test_the_extender_survives_an_apiserver_outage(api: FakeApiserver) -> None:
    add_gpu_node(api, "n1", gpus=1, units=16)
    with run_extender(api) as (state, informers, _):
        api.down("reset")
        time.sleep(0.3)
        api.up()
        api.add_pod(name="after", node_name="n1", limits={MEM: 5}, phase="Running",
                    annotations={ANN_ALIYUN_MEM_IDX: "0"})
        wait_for(lambda: used(state, "n1") == [5], what="state after the outage")
