"""inspect and the scheduler extender count a node's pods alike: a pod the node daemon's published usage already
counts (its gpushare.io/allocated record no newer than the usage) is not counted again; a pod recorded after the
usage, or without a record of its own, is counted from its record on top of it."""

from __future__ import annotations

from devplugin.contract import ANN_ALLOCATED, GpuShare, GpuUsage, PodAssignment
from devplugin.inspect.report import build_report
from devplugin.scheduler.state import ClusterState
from tests.scheduler_objects import node as node_json
from tests.scheduler_objects import pod

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
