"""Multi-GPU pods on an NVLink-island node of the real cluster: one node of 8 GPUs in two NVLink islands of 4
(GPU 0..3 on NUMA node 0, GPU 4..7 on NUMA node 1, the fake driver's `nvlink=` and `numa=`), the real
kube-scheduler with the extender, the kubelet's device manager, the node daemon. With GPU 0..2 held, a pod of 2
whole GPUs lands on two GPUs of island 1 (first-fit would take GPU 3 and 4, one of each island), a 2-GPU slice then
on the two GPUs island 1 has left (first-fit: GPU 3 and 6); from inside each running pod the workload sees exactly
those two GPUs (their UUIDs in NVML), and the pod's GPUAssigned Event says they share NVLink island 1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin_sim.fake_driver import nvlink_node
from tests.realk8s.cluster import Cluster, Spec, running
from tests.realk8s.loopback import namespace_for_test
from tests.realk8s.podspecs import Ask, pod, settled_and_recorded, wait_pods

pytestmark = pytest.mark.realk8s

NODE = "gpu-node-0"
GPUS = tuple(nvlink_node(memory_mib=16 * 1024, node=NODE))
UUID = [g.uuid for g in GPUS]


@pytest.fixture(scope="module")
def islands() -> Iterator[Cluster]:
    with running(Spec(nodes=1, gpu_mib=16 * 1024, node_layouts=(GPUS,))) as cluster:
        yield cluster


@pytest.fixture
def tns(islands: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from namespace_for_test(islands, request, "topo", lines=80, timeout=120)


def placed(cluster: Cluster, ns: str, name: str) -> list[str]:
    """The GPUs the node daemon's record names for c0, once the pod runs."""
    pods = wait_pods(cluster.core, ns, lambda ps: any(p.metadata.name == name and settled_and_recorded(p)
                                                      for p in ps), f"{name} Running with its record", timeout=120)
    p = next(p for p in pods if p.metadata.name == name)
    assert p.status.phase == "Running", (p.status.phase, p.status.message)
    return [s["uuid"] for s in json.loads(p.metadata.annotations[c.ANN_ALLOCATED])["containers"]["c0"]]


def sees(cluster: Cluster, ns: str, name: str) -> list[str]:
    """The UUIDs of the GPUs NVML shows inside the pod's container."""
    return sorted(g["uuid"] for g in cluster.probe(ns, name, "c0")["nvml"]["gpus"])


def assigned(cluster: Cluster, ns: str, name: str) -> str:
    """The pod's GPUAssigned Event (waits for it)."""
    deadline = time.monotonic() + 30
    while True:
        events = [e for e in cluster.core.list_namespaced_event(ns).items
                  if e.involved_object.name == name and e.reason == "GPUAssigned"]
        if events or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert events, f"no GPUAssigned Event for {name}"
    return str(events[0].message)


def test_the_node_publishes_its_islands(islands: Cluster) -> None:
    node = islands.core.read_node(NODE)
    inv = c.parse_inventory(node.metadata.annotations[c.ANN_NODE_GPUS])
    assert [(g.nvlink_island, g.numa_node) for g in inv.gpus] == [(0, 0)] * 4 + [(1, 1)] * 4


def test_two_gpu_pods_land_within_one_island_and_see_those_gpus(islands: Cluster, tns: str) -> None:
    islands.core.create_namespaced_pod(tns, pod("held", [Ask(count=3)]))
    assert sorted(placed(islands, tns, "held")) == sorted(UUID[0:3])

    islands.core.create_namespaced_pod(tns, pod("whole", [Ask(count=2)]))
    got = placed(islands, tns, "whole")
    assert sorted(got) == sorted(UUID[4:6]), [UUID.index(u) for u in got]
    assert sees(islands, tns, "whole") == sorted(UUID[4:6])
    why = assigned(islands, tns, "whole")
    assert "GPUs 4,5 share NVLink island 1" in why, why

    islands.core.create_namespaced_pod(tns, pod("slice", [Ask(mem=8, core=40)],
                                                 labels={c.LABEL_ACK_MULTI_GPU: "2"}))
    got = placed(islands, tns, "slice")
    assert sorted(got) == sorted(UUID[6:8]), [UUID.index(u) for u in got]
    assert sees(islands, tns, "slice") == sorted(UUID[6:8])
    why = assigned(islands, tns, "slice")
    assert "GPUs 6,7 share NVLink island 1" in why, why
