"""Holdings no tenant can write: the node daemon's published usage plus the extender's binds in flight decide a
node's room; a pod's annotations steer only that pod, bounded by its own request. Also: bind binds only what the
filter passed, sidecars hold room for the pod's life, and --resource-domain is honoured by fit and the webhook."""

from __future__ import annotations

import dataclasses

import pytest

from devplugin.contract import (
    ANN_ACK_ALLOCATION,
    ANN_ALLOCATED,
    ANN_NODE_GPUS,
    ANN_SCHEDULED,
    GpuShare,
    GpuUsage,
    PodAssignment,
    parse_inventory,
)
from devplugin.scheduler import admission
from devplugin.scheduler.extender import BindError, bind, filter_nodes
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster, state_with
from tests.support.scheduler_objects import container, node, pod


def whole(*indices: int) -> str:
    return PodAssignment("n1", 1, {"main": tuple(GpuShare(i, "", 16, 100, whole=True) for i in indices)}).render()


def test_a_cpu_pod_claiming_whole_gpus_blocks_nothing() -> None:
    forged = pod("cpu", node_name="n1", phase="Running",
                 annotations={ANN_ALLOCATED: whole(0, 1), ANN_SCHEDULED: whole(0, 1)})
    st = state_with(node("n1", gpus=2, units=16), pods=(forged,))
    assert filter_nodes(st, pod(count=2), ["n1"]).passed == ["n1"]
    assert filter_nodes(st, pod(mem=16), ["n1"]).passed == ["n1"]


def test_a_gpu_pod_claims_at_most_its_own_request() -> None:
    # Asks 2 GiB, claims GPUs 0 and 1 whole: counted as 2 GiB on GPU 0, the first GPU it names.
    greedy = pod("greedy", mem=2, node_name="n1", phase="Running", annotations={ANN_ALLOCATED: whole(0, 1)})
    st = state_with(node("n1", gpus=2, units=16), pods=(greedy,))
    rooms = st.view("n1").gpus
    assert [(r.mem_used, r.whole) for r in rooms] == [(2, False), (0, False)]
    assert filter_nodes(st, pod(count=1), ["n1"]).passed == ["n1"]


def test_a_negative_ack_allocation_cancels_no_room() -> None:
    # Two 15 GiB pods cannot share one 15 GiB GPU, whatever a third pod's ACK annotation says.
    st = state_with(node("n1", gpus=1, units=15))
    neg = pod("neg", mem=1, node_name="n1", phase="Running", annotations={ANN_ACK_ALLOCATION: '{"0":{"0":-15}}'})
    first = pod("first", mem=15, node_name="n1", phase="Running",
                annotations={ANN_ACK_ALLOCATION: '{"0":{"0":15}}'})
    st.replace_pods([neg, first])
    assert [r.mem_used for r in st.view("n1").gpus] == [15]  # the negative record is refused; 15 GiB still held
    out = filter_nodes(st, pod(mem=15), ["n1"])
    assert out.passed == [] and "n1" in out.failed


def test_the_daemons_usage_and_binds_in_flight_decide_the_room() -> None:
    st = state_with(node("n1", gpus=1, units=16, usage={0: GpuUsage(mem=4, containers=1)}, usage_time_ns=100))
    p = pod("p", mem=6)
    st.upsert_pod(p)
    uid = p["metadata"]["uid"]
    cluster = FakeCluster(st)
    filter_nodes(st, p, ["n1"])
    bind(st, cluster, "default", "p", uid, "n1")
    assert [r.mem_used for r in st.view("n1").gpus] == [10]  # 4 the daemon counts + 6 in flight
    ann = dict(cluster.bound[0][2])
    st.upsert_pod({**p, "metadata": {**p["metadata"], "annotations": ann}, "spec": {**p["spec"], "nodeName": "n1"}})
    assert [r.mem_used for r in st.view("n1").gpus] == [10]  # bound, the daemon has not admitted it: in flight
    ann[ANN_ALLOCATED] = PodAssignment("n1", 200, {"main": (GpuShare(0, "", 6, 0),)}).render()
    recorded = {**p, "metadata": {**p["metadata"], "annotations": ann},
                "spec": {**p["spec"], "nodeName": "n1"}, "status": {"phase": "Running"}}
    st.upsert_pod(recorded)
    assert [r.mem_used for r in st.view("n1").gpus] == [10]  # recorded at 200, usage still from 100: in flight
    st.upsert_node(node("n1", gpus=1, units=16, usage={0: GpuUsage(mem=10, containers=2)}, usage_time_ns=300))
    assert [r.mem_used for r in st.view("n1").gpus] == [10]  # the usage counts it now: counted once
    st.upsert_node(node("n1", gpus=1, units=16, usage={0: GpuUsage(mem=6, containers=1)}, usage_time_ns=400))
    assert [r.mem_used for r in st.view("n1").gpus] == [6]  # the other pod ended: the daemon's word lowers it


def test_a_restarted_extender_counts_bound_pods_the_daemon_has_not_admitted() -> None:
    choice = PodAssignment("n1", 5, {"main": (GpuShare(0, "", 8, 0),)}).render()
    bound = pod("b", mem=8, node_name="n1", annotations={ANN_SCHEDULED: choice})
    st = state_with(node("n1", gpus=1, units=16, usage={0: GpuUsage()}, usage_time_ns=100), pods=(bound,))
    assert [r.mem_used for r in st.view("n1").gpus] == [8]
    assert filter_nodes(st, pod(mem=9), ["n1"]).passed == []


def test_bind_refuses_what_the_filter_did_not_pass() -> None:
    st = state_with(node("n1", gpus=1, units=16))
    cpu = pod("cpu")

    class Reads(FakeCluster):
        def get_pod(self, namespace: str, name: str) -> dict:
            return cpu  # the extender keeps GPU pods only; others are read from the apiserver

    cluster = Reads(st)
    gpu = pod("gpu", mem=4)
    st.upsert_pod(gpu)
    with pytest.raises(BindError, match="did not pass this extender's filter for node n1"):
        bind(st, cluster, "default", "gpu", gpu["metadata"]["uid"], "n1")
    filter_nodes(st, gpu, ["n1", "ghost"])
    with pytest.raises(BindError, match="did not pass this extender's filter for node ghost"):
        bind(st, cluster, "default", "gpu", gpu["metadata"]["uid"], "ghost")
    assert cluster.bound == []
    bind(st, cluster, "default", "gpu", gpu["metadata"]["uid"], "n1")
    assert [b[:2] for b in cluster.bound] == [("default/gpu", "n1")]


def test_a_pod_that_names_a_gpu_resource_with_zero_is_bound_as_kube_scheduler_chose() -> None:
    """`aliyun.com/gpu-mem: 0` makes the pod the extender's in kube-scheduler's eyes (it reads names, not
    amounts), so the bind is delegated here: it must bind it, without a GPU choice, or the pod never runs."""
    st = state_with(node("n1", gpus=1, units=16))
    zero = pod("zero")
    zero["spec"]["containers"][0]["resources"] = {"limits": {"aliyun.com/gpu-mem": "0"}}

    class Reads(FakeCluster):
        def get_pod(self, namespace: str, name: str) -> dict:
            return zero

    cluster = Reads(st)
    assert filter_nodes(st, zero, ["n1"]).passed == ["n1"]
    got = bind(st, cluster, "default", "zero", zero["metadata"]["uid"], "n1")
    assert got.node == "n1" and got.containers == {}
    assert cluster.bound == [("default/zero", "n1", {})]


def test_a_sidecar_holds_its_gpu_for_the_pods_life_a_regular_init_container_does_not() -> None:
    side = {**container("side", mem=4), "restartPolicy": "Always"}
    with_sidecar = pod("s", init=[side], containers=[container("app", mem=4)])
    with_init = pod("i", init=[container("prep", mem=4)], containers=[container("app", mem=4)])
    st = state_with(node("n1", gpus=1, units=6))
    assert filter_nodes(st, with_init, ["n1"]).passed == ["n1"]  # the app reuses the init container's devices
    assert filter_nodes(st, with_sidecar, ["n1"]).failed  # 4 + 4 at once on a 6 GiB GPU
    st = state_with(node("n1", gpus=2, units=6))
    assert filter_nodes(st, with_sidecar, ["n1"]).passed == ["n1"]
    shares = {"side": (GpuShare(0, "", 4, 0),), "app": (GpuShare(1, "", 4, 0),)}
    running = pod("r", init=[side], containers=[container("app", mem=4)], node_name="n1", phase="Running",
                  annotations={ANN_ALLOCATED: PodAssignment("n1", 1, shares).render()})
    st.replace_pods([running])
    assert [r.mem_used for r in st.view("n1").gpus] == [4, 4]  # running: the sidecar still holds GPU 0


def domain_node(name: str, domain: str) -> dict:
    obj = node(name, gpus=1, units=16)
    inv = parse_inventory(obj["metadata"]["annotations"][ANN_NODE_GPUS])
    obj["metadata"]["annotations"][ANN_NODE_GPUS] = dataclasses.replace(inv, domain=domain).render()
    return obj


def test_another_resource_domain_is_honoured_by_fit_and_the_webhook() -> None:
    st = ClusterState(domain="example.com")
    st.replace_nodes([domain_node("mine", "example.com"), domain_node("theirs", "aliyun.com")])
    st.replace_pods([])
    big = pod(containers=[container(extra={"example.com/gpu-mem": "20"})])
    out = filter_nodes(st, big, ["mine", "theirs"])
    assert out.failed == {"mine": "GPU 0: at most 16 GiB free on one GPU, 20 GiB asked"}
    assert "node serves aliyun.com/gpu-mem" in out.unresolvable["theirs"]
    verdict = admission.validate(pod(containers=[container(extra={"example.com/gpu-mem": "4",
                                                                  "example.com/gpu-core.percentage": "7"})]),
                                 16, domain="example.com")
    assert not verdict.allowed and "gpu-core.percentage" in verdict.message
