"""The extender places multi-GPU pods within one NVLink island where the node publishes its islands: filter keeps
the nodes that fit, prioritize ranks the node where the pod fits in one island above one where it would straddle,
bind writes GPUs of one island; nodes without topology score as before."""

from __future__ import annotations

from typing import Any

from devplugin.contract import (
    ANN_NODE_GPUS,
    ANN_SCHEDULED,
    LABEL_ACK_MULTI_GPU,
    NodeGpu,
    NodeInventory,
    parse_assignment,
)
from devplugin.scheduler.extender import filter_nodes, prioritize
from devplugin.scheduler.fit import ANY, NUMA, NVLINK, locality_score
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster, held
from tests.support.scheduler_objects import bind, node, pod


def island_node(name: str, islands: tuple[int | None, ...] = (0, 0, 0, 0, 1, 1, 1, 1),
                numa: tuple[int | None, ...] = (0, 0, 0, 0, 1, 1, 1, 1), units: int = 80) -> dict:
    obj = node(name, gpus=len(islands), units=units)
    inv = NodeInventory(mode="core_mem", placement="binpack", mem_unit_mib=1024, gpus=tuple(
        NodeGpu(i, f"GPU-{name}-{i}", "NVIDIA A100-SXM4-80GB", units, units * 1024, nvlink_island=islands[i],
                numa_node=numa[i]) for i in range(len(islands))))
    obj["metadata"]["annotations"][ANN_NODE_GPUS] = inv.render()
    return obj


def state_with(*nodes: dict, pods: tuple[dict, ...] = ()) -> ClusterState:
    st = ClusterState()
    st.replace_nodes(nodes)
    st.replace_pods(pods)
    return st


def whole_held(node_name: str, *indexes: int) -> tuple[dict, ...]:
    return tuple(held(i, 80, node_name=node_name, name=f"w{node_name}{i}", whole=True) for i in indexes)


def chosen(cluster: FakeCluster) -> list[int]:
    return [s.index for s in parse_assignment(cluster.bound[-1][2][ANN_SCHEDULED]).containers["main"]]


def bound_to(st: ClusterState, node_name: str, p: dict[str, Any]) -> list[int]:
    st.upsert_pod(p)
    cluster = FakeCluster(st)
    bind(st, cluster, "default", p["metadata"]["name"], p["metadata"]["uid"], node_name)
    return chosen(cluster)


def test_two_whole_gpus_bind_within_one_island() -> None:
    # island 0 has GPU 2,3 free, island 1 has 5,6,7 free: the tighter island 0 takes them (first-fit would too);
    # then with GPU 2 taken as well, only island 1 has two: first-fit would take 3 and 5
    st = state_with(island_node("n1"), pods=whole_held("n1", 0, 1, 4))
    assert bound_to(st, "n1", pod("a", count=2)) == [2, 3]
    st = state_with(island_node("n1"), pods=whole_held("n1", 0, 1, 2, 4))
    assert bound_to(st, "n1", pod("b", count=2)) == [5, 6]


def test_a_two_gpu_slice_binds_within_one_island() -> None:
    st = state_with(island_node("n1"), pods=(held(3, 70, node_name="n1", name="x"),
                                               held(0, 60, node_name="n1", name="y")))
    # 2 x 15 GiB: binpack's fullest GPUs are 3 (10 free) then 0 (20 free), 1 and 2 of island 0 have 80: one island
    p = pod("s", mem=30, labels={LABEL_ACK_MULTI_GPU: "2"})
    assert bound_to(st, "n1", p) == [0, 1]


def test_prioritize_ranks_the_node_with_a_free_island_first() -> None:
    # n1: one free GPU in each island (a 2-GPU pod straddles both NUMA nodes); n2: island 1 has two free
    st = state_with(island_node("n1"), island_node("n2"),
                    pods=whole_held("n1", 0, 1, 2, 5, 6, 7) + whole_held("n2", 0, 1, 2, 3, 4, 5))
    scores = dict(prioritize(st, pod("p", count=2), ["n1", "n2"]))
    assert scores["n2"] > scores["n1"]
    assert scores["n2"] >= 7 and scores["n1"] <= 3
    assert filter_nodes(st, pod("p", count=2), ["n1", "n2"]).passed == ["n1", "n2"]  # both can fit


def test_the_same_numa_node_ranks_between_an_island_and_a_straddle() -> None:
    st = state_with(island_node("n1", islands=(None,) * 8), pods=whole_held("n1", 0, 1, 2, 4, 5))
    assert 4 <= dict(prioritize(st, pod("q", count=2), ["n1"]))["n1"] <= 6
    assert bound_to(st, "n1", pod("p", count=2)) == [6, 7]  # first-fit: 3 and 6


def test_one_gpu_pods_and_nodes_without_topology_score_as_before() -> None:
    plain = state_with(node("n1", gpus=8, units=80), pods=whole_held("n1", 0, 1))
    topo = state_with(island_node("n1"), pods=whole_held("n1", 0, 1))
    assert dict(prioritize(plain, pod("p", mem=10), ["n1"])) == dict(prioritize(topo, pod("p", mem=10), ["n1"]))
    assert dict(prioritize(plain, pod("p", count=2), ["n1"]))["n1"] == 5  # 4 of 8 GPUs held once placed


def test_locality_bands_do_not_overlap() -> None:
    for value in (0.0, 0.3, 0.5, 0.99, 1.0):
        assert locality_score(ANY, value) < locality_score(NUMA, 0.0) or value == 1.0
        assert locality_score(NUMA, value) < locality_score(NVLINK, 0.0)
    assert locality_score(ANY, 1.0) <= locality_score(NUMA, 0.0)
