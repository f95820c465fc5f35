"""Choosing and avoiding GPUs by model and UUID on the real cluster: a node of A100s and a node of H100s, the real
kube-scheduler with the extender, the kubelet's device manager, the node daemons and the webhooks. Where a pod lands,
which GPU it sees from inside (NVML's UUID and product name, through the workload probe), and the refusals: a
malformed selection at the webhook, a model no node has at the extender's filter (a reason per node), and a pod
bound past the scheduler to a node whose GPUs it excludes by its node daemon (the pod's Event)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from devplugin import contract as c
from tests.realk8s.cluster import Cluster, Spec, node_gpus, running
from tests.realk8s.loopback import namespace_for_test
from tests.realk8s.podspecs import Ask, pod, settled_and_recorded, unschedulable, wait_pods

pytestmark = pytest.mark.realk8s

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
GPU_MIB = 16 * 1024
A_NODE, H_NODE = "gpu-node-0", "gpu-node-1"
LAYOUTS = (
    tuple(dataclasses.replace(g, name=A100) for g in node_gpus(A_NODE, 2, GPU_MIB)),
    tuple(dataclasses.replace(g, name=H100, compute_capability=(9, 0)) for g in node_gpus(H_NODE, 2, GPU_MIB)),
)
H100_0, H100_1 = (g.uuid for g in LAYOUTS[1])


@pytest.fixture(scope="module")
def mixed() -> Iterator[Cluster]:
    with running(Spec(nodes=2, gpu_mib=GPU_MIB, node_layouts=LAYOUTS)) as cluster:
        yield cluster


@pytest.fixture
def sns(mixed: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from namespace_for_test(mixed, request, "sel", lines=80, timeout=120)


def placed(cluster: Cluster, ns: str, name: str) -> tuple[str, list[str]]:
    """(node, the GPUs the daemon's record names for c0) once the pod runs."""
    pods = wait_pods(cluster.core, ns, lambda ps: any(p.metadata.name == name and settled_and_recorded(p)
                                                      for p in ps), f"{name} Running with its record", timeout=120)
    p = next(p for p in pods if p.metadata.name == name)
    assert p.status.phase == "Running", (p.status.phase, p.status.message)
    record = json.loads(p.metadata.annotations[c.ANN_ALLOCATED])
    return p.spec.node_name, [s["uuid"] for s in record["containers"]["c0"]]


def sees(cluster: Cluster, ns: str, name: str) -> list[tuple[str, str]]:
    """(UUID, product name) of every GPU NVML shows inside the pod's container."""
    view = cluster.probe(ns, name, "c0")
    return [(g["uuid"], g["name"]) for g in view["nvml"]["gpus"]]


def test_a_model_choice_lands_on_that_model_and_the_workload_sees_it(mixed: Cluster, sns: str) -> None:
    mixed.core.create_namespaced_pod(sns, pod("h100", [Ask(mem=4, core=30)], annotations={
        c.ANN_USE_GPU_MODEL: "h100"}))
    mixed.core.create_namespaced_pod(sns, pod("not-h100", [Ask(mem=4, core=30)], annotations={
        c.ANN_HAMI_NOUSE_GPU_TYPE: "H100"}))
    node, gpus = placed(mixed, sns, "h100")
    assert node == H_NODE and len(gpus) == 1
    assert sees(mixed, sns, "h100") == [(gpus[0], H100)]
    node, gpus = placed(mixed, sns, "not-h100")
    assert node == A_NODE
    assert sees(mixed, sns, "not-h100") == [(gpus[0], A100)]


def test_an_avoided_gpu_is_not_given_where_binpack_would_give_it(mixed: Cluster, sns: str) -> None:
    mixed.core.create_namespaced_pod(sns, pod("avoids", [Ask(mem=4, core=30)], annotations={
        c.ANN_USE_GPU_MODEL: "H100", c.ANN_AVOID_GPU_UUID: H100_0}))
    node, gpus = placed(mixed, sns, "avoids")
    assert (node, gpus) == (H_NODE, [H100_1])  # both H100s are empty: binpack alone takes GPU 0
    assert sees(mixed, sns, "avoids") == [(H100_1, H100)]


def test_a_model_no_node_has_stays_pending_with_a_reason_per_node(mixed: Cluster, sns: str) -> None:
    mixed.core.create_namespaced_pod(sns, pod("v100", [Ask(mem=4, core=30)], annotations={
        c.ANN_USE_GPU_MODEL: "V100"}))
    pods = wait_pods(mixed.core, sns, lambda ps: any(unschedulable(p) for p in ps), "v100 unschedulable")
    why = unschedulable(pods[0])
    assert f"{c.ANN_USE_GPU_MODEL}=V100" in why, why
    assert A100 in why and H100 in why, why
    time.sleep(2)
    assert not mixed.core.read_namespaced_pod("v100", sns).spec.node_name


def test_the_webhook_refuses_a_mig_uuid_and_a_contradiction(mixed: Cluster, sns: str) -> None:
    for given, says in (({c.ANN_USE_GPU_UUID: "MIG-" + H100_0[4:]}, "MIG instance's UUID"),
                              ({c.ANN_USE_GPU_UUID: H100_0, c.ANN_HAMI_NOUSE_GPU_UUID: H100_0},
                               "cannot be both chosen and avoided")):
        with pytest.raises(ApiException) as exc:
            mixed.core.create_namespaced_pod(sns, pod("bad", [Ask(mem=4, core=30)], annotations=given))
        assert says in str(exc.value.body), exc.value.body


def test_the_node_daemon_refuses_a_pod_bound_past_the_scheduler_to_gpus_it_excludes(mixed: Cluster,
                                                                                    sns: str) -> None:
    mixed.core.create_namespaced_pod(sns, pod("bound", [Ask(mem=4, core=30)], node_name=A_NODE, annotations={
        c.ANN_USE_GPU_MODEL: "H100"}))
    mixed.core.create_namespaced_pod(sns, pod("bound-ok", [Ask(mem=4, core=30)], node_name=H_NODE, annotations={
        c.ANN_AVOID_GPU_UUID: H100_0}))
    pods = wait_pods(mixed.core, sns, lambda ps: any(p.metadata.name == "bound" and p.status.phase == "Failed"
                                                     for p in ps), "bound Failed by its node", timeout=120)
    failed = next(p for p in pods if p.metadata.name == "bound")
    assert "excludes every GPU of this node" in (failed.status.message or ""), failed.status.message

    def event() -> list[k8s.CoreV1Event]:
        return [e for e in mixed.core.list_namespaced_event(sns).items
                if e.involved_object.name == "bound" and e.reason == "GPUAllocationFailed"]

    deadline = time.monotonic() + 30
    while not event() and time.monotonic() < deadline:
        time.sleep(0.5)
    msg = event()[0].message
    assert f"{c.ANN_USE_GPU_MODEL}=H100" in msg and A100 in msg, msg
    node, gpus = placed(mixed, sns, "bound-ok")
    assert (node, gpus) == (H_NODE, [H100_1])
    assert sees(mixed, sns, "bound-ok") == [(H100_1, H100)]
