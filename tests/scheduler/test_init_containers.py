"""The kubelet's rule for a pod's effective request, per resource: max(each regular init container, app
containers + sidecars). A regular init container ends before the app containers start and is not placed beside
them; a sidecar runs beside them for the pod's life."""

from __future__ import annotations

from devplugin.contract import ANN_SCHEDULED, GpuShare, PodAssignment
from devplugin.scheduler.extender import bind, filter_nodes, prioritize
from tests.scheduler.test_extender import FakeCluster, state_with
from tests.support.scheduler_objects import container, node, pod


def sidecar(name: str, mem: int) -> dict:
    return {**container(name, mem=mem), "restartPolicy": "Always"}


def test_a_larger_init_container_fits_where_its_app_container_would() -> None:
    p = pod("init", init=[container("prep", mem=10)], containers=[container("app", mem=4)])
    st = state_with(node("n1", gpus=1, units=10))
    assert filter_nodes(st, p, ["n1"]).passed == ["n1"]  # max(10, 4) = 10, not 14
    assert dict(prioritize(st, p, ["n1"]))["n1"] > 0
    st = state_with(node("n1", gpus=1, units=9))
    out = filter_nodes(st, p, ["n1"])
    assert out.passed == [] and "'prep'" in out.failed["n1"] and "10" in out.failed["n1"]


def test_a_sidecar_beside_the_app_container_needs_the_sum() -> None:
    p = pod("side", init=[sidecar("proxy", 10)], containers=[container("app", mem=4)])
    assert filter_nodes(state_with(node("n1", gpus=1, units=13)), p, ["n1"]).passed == []
    assert filter_nodes(state_with(node("n1", gpus=1, units=14)), p, ["n1"]).passed == ["n1"]


def test_an_init_container_runs_beside_the_sidecars_started_before_it() -> None:
    before = pod("b", init=[sidecar("proxy", 4), container("prep", mem=10)], containers=[container("app", mem=2)])
    after = pod("a", init=[container("prep", mem=10), sidecar("proxy", 4)], containers=[container("app", mem=2)])
    st = state_with(node("n1", gpus=1, units=12))
    assert filter_nodes(st, before, ["n1"]).passed == []  # 4 + 10 while prep runs
    assert filter_nodes(st, after, ["n1"]).passed == ["n1"]  # max(10, 4 + 2)
    assert filter_nodes(state_with(node("n1", gpus=1, units=14)), before, ["n1"]).passed == ["n1"]


def test_a_bound_pending_pod_holds_the_larger_of_its_init_and_app_containers() -> None:
    p = pod("init", init=[container("prep", mem=10)], containers=[container("app", mem=4)])
    st = state_with(node("n1", gpus=1, units=16))
    st.upsert_pod(p)
    cluster = FakeCluster(st)
    filter_nodes(st, p, ["n1"])
    assignment = bind(st, cluster, "default", "init", p["metadata"]["uid"], "n1")
    assert {n: [(s.index, s.mem) for s in shares] for n, shares in assignment.containers.items()} == {
        "prep": [(0, 10)], "app": [(0, 4)]}
    assert [r.mem_used for r in st.view("n1").gpus] == [10]  # in flight: max(10, 4), not 14
    seen = {**p, "metadata": {**p["metadata"], "annotations": dict(cluster.bound[0][2])},
            "spec": {**p["spec"], "nodeName": "n1"}}
    assert ANN_SCHEDULED in seen["metadata"]["annotations"]
    st.replace_pods([seen])
    assert [r.mem_used for r in st.view("n1").gpus] == [10]  # seen bound, still Pending: 10
    assert filter_nodes(st, pod("other", mem=6), ["n1"]).passed == ["n1"]
    assert filter_nodes(st, pod("big", mem=7), ["n1"]).passed == []
    running = {**seen, "status": {"phase": "Running"}}
    st.replace_pods([running])
    assert [r.mem_used for r in st.view("n1").gpus] == [4]  # running: the init container has ended


def test_an_init_container_on_another_gpu_than_the_app_holds_it_only_while_pending() -> None:
    choice = PodAssignment("n1", 1, {"prep": (GpuShare(1, "", 10, 0),), "app": (GpuShare(0, "", 4, 0),)}).render()
    p = pod("two", init=[container("prep", mem=10)], containers=[container("app", mem=4)],
            annotations={ANN_SCHEDULED: choice}, node_name="n1")
    st = state_with(node("n1", gpus=2, units=16), pods=(p,))
    assert [r.mem_used for r in st.view("n1").gpus] == [4, 10]
    st.replace_pods([{**p, "status": {"phase": "Running"}}])
    assert [r.mem_used for r in st.view("n1").gpus] == [4, 0]
