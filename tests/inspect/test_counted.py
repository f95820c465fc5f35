"""inspect and the scheduler extender count a node's pods alike: a pod the node daemon's published usage already
counts (its gpushare.io/allocated record no newer than the usage) is not counted again; a pod recorded after the
usage, or without a record of its own, is counted from its record on top of it; so is a container the record does not
name yet (the daemon records a pod container by container)."""

from __future__ import annotations

from devplugin.contract import ANN_ALLOCATED, ANN_SCHEDULED, GpuShare, GpuUsage, PodAssignment
from devplugin.inspect.report import build_report
from devplugin.scheduler.extender import filter_nodes
from devplugin.scheduler.state import ClusterState
from tests.support.scheduler_objects import container, pod
from tests.support.scheduler_objects import node as node_json

USAGE_NS = 1_000


def placed(name: str, mem: int, core: int, time_ns: int, uid: str, record_uid: str | None = None) -> dict:
    record = PodAssignment("n", time_ns, {"main": (GpuShare(0, "", mem, core),)},
                           uid=uid if record_uid is None else record_uid)
    return pod(name, mem=mem, core=core, node_name="n", phase="Running", uid=uid,
               annotations={ANN_ALLOCATED: record.render()})


def test_inspect_and_the_extender_count_each_pod_once_from_the_daemon_s_usage() -> None:
    # the daemon's usage at USAGE_NS counts a (recorded before it) and b (recorded at the same nanosecond): 3 + 3
    node = node_json("n", gpus=2, units=16, usage={0: GpuUsage(mem=6, core=30, containers=2)}, usage_time_ns=USAGE_NS)
    pods = [placed("a", 3, 10, USAGE_NS - 100, "uid-a"),
            placed("b", 3, 20, USAGE_NS, "uid-b"),
            placed("c", 4, 5, USAGE_NS + 1, "uid-c"),  # recorded after the usage: not in it yet
            placed("d", 2, 5, USAGE_NS - 100, "uid-d", record_uid="uid-other")]  # a record not the daemon's for d
    gpu = build_report([node], pods).nodes[0].gpus[0]
    assert (gpu.memAllocated, gpu.coreAllocated) == (6 + 4 + 2, 30 + 5 + 5)
    assert sorted(p.name for p in gpu.pods) == ["a", "b", "c", "d"]

    state = ClusterState()
    state.upsert_node(node)
    for p in pods:
        state.upsert_pod(p)
    view = state.view("n")
    assert view is not None
    assert (view.gpus[0].mem_allocated, view.gpus[0].core_allocated) == (gpu.memAllocated, gpu.coreAllocated)


def test_without_a_published_usage_every_placed_pod_counts() -> None:
    node = node_json("n", gpus=1, units=16)
    pods = [placed("a", 3, 10, USAGE_NS, "uid-a"), placed("b", 5, 20, USAGE_NS, "uid-b")]
    gpu = build_report([node], pods).nodes[0].gpus[0]
    assert (gpu.memAllocated, gpu.coreAllocated) == (8, 30)
    state = ClusterState()
    state.upsert_node(node)
    for p in pods:
        state.upsert_pod(p)
    view = state.view("n")
    assert view is not None and (view.gpus[0].mem_allocated, view.gpus[0].core_allocated) == (8, 30)


def test_a_pod_recorded_container_by_container_keeps_its_unrecorded_containers_counted() -> None:
    # The daemon records c0 (GPU 0) and publishes its usage before the kubelet asks for c1 (chosen on GPU 1): the
    # usage counts c0 only, so c1 is still in flight on GPU 1 whatever the order of the record and the usage.
    choice = PodAssignment("n", 1, {"c0": (GpuShare(0, "", 4, 10),), "c1": (GpuShare(1, "", 6, 20),)})
    first = PodAssignment("n", USAGE_NS - 100, {"c0": (GpuShare(0, "", 4, 10),)}, uid="uid-two")
    two = pod("two", node_name="n", phase="Pending", uid="uid-two",
              containers=[container("c0", mem=4, core=10), container("c1", mem=6, core=20)],
              annotations={ANN_SCHEDULED: choice.render(), ANN_ALLOCATED: first.render()})
    node = node_json("n", gpus=2, units=16, usage={0: GpuUsage(mem=4, core=10, containers=1)}, usage_time_ns=USAGE_NS)
    gpus = build_report([node], [two]).nodes[0].gpus
    assert [(g.memAllocated, g.coreAllocated) for g in gpus] == [(4, 10), (6, 20)]

    state = ClusterState()
    state.upsert_node(node)
    state.upsert_pod(two)
    view = state.view("n")
    assert view is not None
    assert [(g.mem_allocated, g.core_allocated) for g in view.gpus] == [(4, 10), (6, 20)]
    # a pod of 13 GiB fits neither GPU (12 and 10 GiB free): the extender must not place it on GPU 1
    out = filter_nodes(state, pod("big", mem=13), ["n"])
    assert out.passed == [] and "n" in out.failed
    # the pod itself left out (scheduled again, or a preemption victim): nothing of it stays counted
    alone = state.view("n", "uid-two")
    assert alone is not None and [(g.mem_allocated, g.core_allocated) for g in alone.gpus] == [(0, 0), (0, 0)]
