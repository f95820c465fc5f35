"""The extender's logic over ClusterState: filter reasons, modes, whole GPUs, multi-GPU shares, scores, bind
(assume, annotations, undo, races), assumption expiry and rebuilding the state from annotations."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pytest

from devplugin.contract import (
    ANN_ALIYUN_ASSIGNED,
    ANN_ALIYUN_MEM_DEV,
    ANN_ALIYUN_MEM_IDX,
    ANN_ALIYUN_MEM_POD,
    ANN_ALLOCATED,
    ANN_MULTI_GPU,
    ANN_SCHEDULED,
    LABEL_ACK_MULTI_GPU,
    GpuShare,
    GpuUsage,
    PodAssignment,
    parse_assignment,
)
from devplugin.scheduler.extender import BindError, filter_nodes, prioritize
from devplugin.scheduler.state import ClusterState
from tests.support.scheduler_objects import bind, container, node, pod


class FakeCluster:
    """Records Bindings and applies their annotations to the state, as the apiserver + watch would."""

    def __init__(self, state: ClusterState, fail: str = "") -> None:
        self.state = state
        self.fail = fail
        self.bound: list[tuple[str, str, dict]] = []
        self.lock = threading.Lock()

    def get_pod(self, namespace: str, name: str) -> dict:
        raise LookupError(f"pod {namespace}/{name} not found")

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        if self.fail:
            raise RuntimeError(self.fail)
        with self.lock:
            self.bound.append((f"{namespace}/{name}", node, dict(annotations)))


def state_with(*nodes: dict, pods: tuple[dict, ...] = ()) -> ClusterState:
    st = ClusterState()
    st.replace_nodes(nodes)
    st.replace_pods(pods)
    return st


def held(index: int, mem: int, core: int = 0, node_name: str = "n1", name: str = "old", whole: bool = False,
         annotation: str = ANN_ALLOCATED) -> dict:
    share = GpuShare(index, "", mem, core, whole)
    ann = {annotation: PodAssignment(node_name, 1, {"main": (share,)}).render()}
    return pod(name, mem=0 if whole else mem, core=core, count=1 if whole else 0, node_name=node_name,
               annotations=ann, phase="Running")


def test_fragmentation_fails_with_reason_and_a_gpu_with_room_passes() -> None:
    # n1: 4 x 15 GiB free (60 in all); n2: GPU 0 has 20 GiB free.
    st = state_with(node("n1", gpus=4, units=15), node("n2", gpus=2, units=24),
                    pods=(held(1, 20, node_name="n2"), held(0, 4, node_name="n2", name="small")))
    out = filter_nodes(st, pod("big", mem=20), ["n1", "n2"])
    assert out.passed == ["n2"]
    assert out.failed == {"n1": "GPU 0..3: at most 15 GiB free on one GPU, 20 GiB asked"}
    assert not out.unresolvable


def test_filter_counts_memory_and_compute_together() -> None:
    st = state_with(node("n1", gpus=2, units=16), pods=(held(0, 2, core=80), held(1, 14, core=10, name="b")))
    out = filter_nodes(st, pod(mem=4, core=30), ["n1"])
    assert out.failed["n1"] == "GPU 0,1: the GPUs with 4 GiB free have at most 20 % compute free, 30 % asked"
    assert filter_nodes(st, pod(mem=4, core=20), ["n1"]).passed == ["n1"]


def test_modes_serve_what_they_advertise() -> None:
    st = state_with(node("cm", mode="core_mem"), node("cg", mode="cgpu"), node("sh", mode="share"))
    names = ["cm", "cg", "sh"]
    core = filter_nodes(st, pod(mem=2, core=10), names)
    assert core.passed == ["cm"]
    assert "does not serve gpu-core.percentage" in core.unresolvable["cg"]
    assert set(filter_nodes(st, pod(mem=2), names).passed) == set(names)  # memory-only: everywhere
    assert set(filter_nodes(st, pod(count=1), names).passed) == set(names)


def test_memory_only_container_on_core_mem_node_holds_no_compute() -> None:
    st = state_with(node("n1", gpus=1, units=16))
    cluster = FakeCluster(st)
    st.upsert_pod(p := pod("m", mem=4))
    bind(st, cluster, "default", "m", p["metadata"]["uid"], "n1")
    share = parse_assignment(cluster.bound[0][2][ANN_SCHEDULED]).containers["main"][0]
    assert (share.mem, share.core) == (4, 0)
    assert filter_nodes(st, pod(mem=4, core=100), ["n1"]).passed == ["n1"]


def test_unhealthy_gpus_and_nodes_without_inventory() -> None:
    bare = {"metadata": {"name": "bare", "labels": {}, "annotations": {}}}
    st = state_with(node("n1", gpus=2, units=16, unhealthy=(0,)), bare)
    st.upsert_pod(held(1, 10))
    out = filter_nodes(st, pod(mem=8), ["n1", "bare", "ghost"])
    assert out.failed["n1"] == "GPU 1: at most 6 GiB free on one GPU, 8 GiB asked (GPU 0 unhealthy)"
    assert "publishes no GPU inventory" in out.unresolvable["bare"]
    assert "not seen by the extender" in out.failed["ghost"]


def test_whole_gpus_need_empty_gpus_and_take_no_slices() -> None:
    st = state_with(node("n1", gpus=3, units=16), pods=(held(0, 1),))
    assert filter_nodes(st, pod(count=2), ["n1"]).passed == ["n1"]
    out = filter_nodes(st, pod(count=3), ["n1"])
    assert out.failed["n1"] == "GPU 0..2: 2 GPU(s) have nothing on them, 3 whole GPU(s) asked"
    st.upsert_pod(held(1, 16, whole=True, name="w"))
    out = filter_nodes(st, pod(mem=15), ["n1"])  # GPU 1 is held whole, GPU 0 has 15 free, GPU 2 16
    assert out.passed == ["n1"]
    out = filter_nodes(st, pod(mem=16, core=5), ["n1"])
    assert filter_nodes(st, pod(count=2), ["n1"]).failed["n1"] == (
        "GPU 0,2: 1 GPU(s) have nothing on them, 2 whole GPU(s) asked (GPU 1 held whole)")
    assert out.passed == ["n1"]


def test_multi_gpu_share_splits_over_n_gpus() -> None:
    st = state_with(node("n1", gpus=4, units=16), pods=(held(0, 10), held(1, 10, name="b")))
    label = {LABEL_ACK_MULTI_GPU: "2"}
    assert filter_nodes(st, pod(mem=24, core=40, labels=label), ["n1"]).passed == ["n1"]  # 12 + 20 % on 2, 3
    out = filter_nodes(st, pod(mem=24, labels={LABEL_ACK_MULTI_GPU: "3"}), ["n1"])
    assert out.failed["n1"] == "GPU 0..3: 2 GPU(s) have 8 GiB free, 3 needed for a 3-GPU share"
    bad = filter_nodes(st, pod(mem=5, annotations={ANN_MULTI_GPU: "2"}), ["n1"])
    assert "do not split evenly over 2 GPUs" in bad.unresolvable["n1"]
    cluster = FakeCluster(st)
    st.upsert_pod(p := pod("m", mem=24, core=40, labels=label))
    bind(st, cluster, "default", "m", p["metadata"]["uid"], "n1")
    shares = parse_assignment(cluster.bound[0][2][ANN_SCHEDULED]).containers["main"]
    assert [(s.index, s.mem, s.core) for s in shares] == [(2, 12, 20), (3, 12, 20)]


def test_several_containers_fit_together_or_not_at_all() -> None:
    st = state_with(node("n1", gpus=2, units=10))
    two = pod(containers=[container("a", mem=6), container("b", mem=6), container("c", mem=4)])
    assert filter_nodes(st, two, ["n1"]).passed == ["n1"]  # 6+4 on one GPU, 6 on the other
    three = pod(containers=[container("a", mem=6), container("b", mem=6), container("c", mem=6)])
    assert filter_nodes(st, three, ["n1"]).failed["n1"] == (
        "container 'c': GPU 0,1: at most 4 GiB free on one GPU, 6 GiB asked")


def test_usage_annotation_is_a_floor_for_pods_placed_without_annotations() -> None:
    st = state_with(node("n1", gpus=1, units=16, usage={0: GpuUsage(mem=12, core=0, containers=1)}))
    assert filter_nodes(st, pod(mem=8), ["n1"]).failed["n1"].startswith("GPU 0: at most 4 GiB free")


def test_pods_asking_nothing_pass_and_malformed_asks_are_unresolvable() -> None:
    st = state_with(node("n1"))
    assert filter_nodes(st, pod(), ["n1"]).passed == ["n1"]
    bad = pod(containers=[{"name": "x", "resources": {"limits": {"aliyun.com/gpu-mem": "1.5"}}}])
    assert "not a whole number" in filter_nodes(st, bad, ["n1"]).unresolvable["n1"]
    core_only = pod(core=20)
    assert "without gpu-mem" in filter_nodes(st, core_only, ["n1"]).unresolvable["n1"]


def test_full_node_objects_are_read_when_the_watch_has_not_seen_them() -> None:
    st = state_with(node("n1", gpus=1, units=8))
    template = node("template-1", gpus=2, units=24)
    out = filter_nodes(st, pod(mem=20), None, [node("n1", gpus=1, units=8), template])
    assert out.passed == ["template-1"] and "n1" in out.failed


def test_binpack_prefers_the_fuller_node_and_spread_the_emptier() -> None:
    for placement in ("binpack", "spread"):
        st = state_with(node("half", gpus=2, units=16, placement=placement),
                        node("empty", gpus=2, units=16, placement=placement), pods=(held(0, 16, node_name="half"),))
        scores = dict(prioritize(st, pod(mem=8), ["half", "empty"]))
        assert all(0 <= s <= 10 for s in scores.values())
        if placement == "binpack":
            assert scores == {"half": 8, "empty": 3}  # (16 + 8) / 32 = 0.75, 8 / 32 = 0.25
        else:
            assert scores == {"half": 3, "empty": 8}


def test_bind_places_by_policy_and_writes_the_contract_annotations() -> None:
    st = state_with(node("n1", gpus=3, units=16), pods=(held(1, 10),))
    cluster = FakeCluster(st)
    st.upsert_pod(p := pod("train", mem=4, core=20, namespace="ml"))
    assignment = bind(st, cluster, "ml", "train", p["metadata"]["uid"], "n1")
    key, where, ann = cluster.bound[0]
    assert (key, where) == ("ml/train", "n1")
    chosen = parse_assignment(ann[ANN_SCHEDULED])
    assert chosen == assignment and chosen.node == "n1" and chosen.time_ns > 0
    assert chosen.containers["main"] == (GpuShare(1, "GPU-n1-1", 4, 20),)  # binpack: the fullest that fits
    assert ann[ANN_ALIYUN_MEM_IDX] == "1" and ann[ANN_ALIYUN_MEM_POD] == "4" and ann[ANN_ALIYUN_MEM_DEV] == "16"
    assert ann[ANN_ALIYUN_ASSIGNED] == "false"
    # The assumption holds the room until the watch shows the pod bound.
    assert st.view("n1").gpus[1].mem_used == 14


def test_bind_failure_undoes_the_assumption_and_says_why() -> None:
    st = state_with(node("n1", gpus=1, units=16))
    st.upsert_pod(p := pod("x", mem=16))
    with pytest.raises(BindError, match="binding pod default/x to n1 failed: apiserver down"):
        bind(st, FakeCluster(st, fail="apiserver down"), "default", "x", p["metadata"]["uid"], "n1")
    assert st.view("n1").gpus[0].mem_used == 0
    assert filter_nodes(st, pod(mem=16), ["n1"]).passed == ["n1"]


def test_bind_refuses_a_pod_that_no_longer_fits_or_was_recreated() -> None:
    st = state_with(node("n1", gpus=1, units=16), pods=(held(0, 10),))
    st.upsert_pod(p := pod("x", mem=8))
    with pytest.raises(BindError, match="no longer fits node n1: GPU 0: at most 6 GiB free"):
        bind(st, FakeCluster(st), "default", "x", p["metadata"]["uid"], "n1")
    with pytest.raises(BindError, match="not found"):
        bind(st, FakeCluster(st), "default", "x", "another-uid", "n1")


def test_two_binds_racing_for_the_last_room_exactly_one_wins() -> None:
    st = state_with(node("n1", gpus=2, units=16), pods=(held(0, 16), held(1, 8, name="b")))
    cluster = FakeCluster(st)
    contenders = [pod(f"r{i}", mem=8) for i in range(8)]
    for p in contenders:
        st.upsert_pod(p)
    results: list[str] = []
    start = threading.Barrier(len(contenders))

    def run(p: dict) -> None:
        start.wait()
        try:
            bind(st, cluster, "default", p["metadata"]["name"], p["metadata"]["uid"], "n1")
            results.append("won")
        except BindError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=run, args=(p,)) for p in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("won") == 1 and len(cluster.bound) == 1
    assert all("at most 0 GiB free" in r for r in results if r != "won")


def test_assumptions_expire_when_the_pod_is_not_bound_in_time() -> None:
    now = [100.0]
    st = ClusterState(clock=lambda: now[0], assume_ttl_s=30)
    st.replace_nodes([node("n1", gpus=1, units=16)])
    p = pod("slow", mem=16)
    from devplugin.allocation.requests import pod_request
    st.assume(pod_request(p), "n1", {"main": (GpuShare(0, "", 16, 0),)})
    assert filter_nodes(st, pod(mem=1), ["n1"]).failed
    now[0] += 29
    assert filter_nodes(st, pod(mem=1), ["n1"]).failed
    now[0] += 2
    assert filter_nodes(st, pod(mem=1), ["n1"]).passed == ["n1"]
    # Bound by us: held until the watch shows the pod bound (then it is the watch's), or expired if it never does.
    st.assume(pod_request(p), "n1", {"main": (GpuShare(0, "", 16, 0),)})
    st.confirm_bound(p["metadata"]["uid"])
    now[0] += 10
    assert st.expire() == [] and st.view("n1").gpus[0].mem_used == 16
    shown = {**p, "spec": {**p["spec"], "nodeName": "n1"}}  # bound, annotations not readable: ours are kept
    st.upsert_pod(shown)
    now[0] += 1000
    assert st.expire() == [] and st.view("n1").gpus[0].mem_used == 16
    st.delete_pod(shown)
    assert st.view("n1").gpus[0].mem_used == 0
    gone = pod("gone", mem=16)
    st.assume(pod_request(gone), "n1", {"main": (GpuShare(0, "", 16, 0),)})
    st.confirm_bound(gone["metadata"]["uid"])
    now[0] += 31
    assert [h.key for h in st.expire()] == ["default/gone"] and st.view("n1").gpus[0].mem_used == 0


def test_watch_replaces_the_assumption_and_a_restart_rebuilds_the_same_room() -> None:
    st = state_with(node("n1", gpus=2, units=16))
    cluster = FakeCluster(st)
    pods = [pod(f"p{i}", mem=6, core=10) for i in range(3)]
    for p in pods:
        st.upsert_pod(p)
        bind(st, cluster, "default", p["metadata"]["name"], p["metadata"]["uid"], "n1")
    before = [(g.mem_used, g.core_used, g.containers) for g in st.view("n1").gpus]
    # What the apiserver now holds: the pods bound, with the Binding's annotations.
    bound = []
    for p, (_, where, ann) in zip(pods, cluster.bound, strict=True):
        p = {**p, "spec": {**p["spec"], "nodeName": where},
             "metadata": {**p["metadata"], "annotations": ann}}
        st.upsert_pod(p)
        bound.append(p)
    assert all(not st.held(p["metadata"]["uid"]).assumed for p in bound)
    assert [(g.mem_used, g.core_used, g.containers) for g in st.view("n1").gpus] == before
    restarted = state_with(node("n1", gpus=2, units=16), pods=tuple(bound))
    assert [(g.mem_used, g.core_used, g.containers) for g in restarted.view("n1").gpus] == before
    assert before == [(12, 20, 2), (6, 10, 1)]  # binpack: two on GPU 0, the third did not fit there


def test_finished_and_deleted_pods_free_their_room() -> None:
    done = held(0, 16)
    st = state_with(node("n1", gpus=1, units=16), pods=(done,))
    assert filter_nodes(st, pod(mem=1), ["n1"]).failed
    st.upsert_pod({**done, "status": {"phase": "Succeeded"}})
    assert filter_nodes(st, pod(mem=16), ["n1"]).passed == ["n1"]
    again = held(0, 16, name="again")
    st.upsert_pod(again)
    st.delete_pod(again)
    assert filter_nodes(st, pod(mem=16), ["n1"]).passed == ["n1"]


def test_alibaba_and_ack_annotations_count_as_held() -> None:
    ali = pod("ali", mem=6, node_name="n1", phase="Running", annotations={ANN_ALIYUN_MEM_IDX: "1"})
    ack = pod("ack", containers=[container("a", mem=3)], node_name="n1", phase="Running",
              annotations={"scheduler.framework.gpushare.allocation": '{"0":{"0":3}}'})
    st = state_with(node("n1", gpus=2, units=8), pods=(ali, ack))
    assert [g.mem_used for g in st.view("n1").gpus] == [3, 6]


def test_a_pod_already_bound_keeps_what_it_holds() -> None:
    st = state_with(node("n1", gpus=1, units=16))
    bound = held(0, 10, name="done-before")
    st.upsert_pod(bound)
    with pytest.raises(BindError, match="already bound to node n1"):
        bind(st, FakeCluster(st), "default", "done-before", bound["metadata"]["uid"], "n1")
    assert st.view("n1").gpus[0].mem_used == 10


def test_preemption_plans_are_kept_only_where_evicting_frees_a_gpu() -> None:
    from devplugin.scheduler.extender import preempt

    # n1: GPU 0 holds a (8) and d (4), GPU 1 holds b (8); n2: GPU 0 holds c (16), GPU 1 holds e (4).
    a, d, b = held(0, 8, name="a"), held(0, 4, name="d"), held(1, 8, name="b")
    c_, e = held(0, 16, node_name="n2", name="c"), held(1, 4, node_name="n2", name="e")
    st = state_with(node("n1", gpus=2, units=16), node("n2", gpus=2, units=16), pods=(a, d, b, c_, e))
    uid = lambda p: p["metadata"]["uid"]  # noqa: E731
    big = pod("big", mem=12)
    plans = {"n1": [uid(a)], "n2": [uid(c_)]}  # either eviction leaves 12 free on one GPU
    assert preempt(st, big, plans) == plans
    huge = pod("huge", mem=16)
    # Evicting a frees 8 of n1's GPU 0 (d stays): 12 free there, 8 on GPU 1; the node's total (20) is no help.
    assert preempt(st, huge, {"n1": [uid(a)], "n2": [uid(c_)]}) == {"n2": [uid(c_)]}
    assert preempt(st, huge, {"n1": [uid(a), uid(d)]}) == {"n1": [uid(a), uid(d)]}
    assert preempt(st, huge, {"n2": []}) == {}  # nothing evicted: GPU 1 has 12 free
    assert preempt(st, huge, {"n2": [uid(e)]}) == {"n2": [uid(e)]}
    assert preempt(st, pod("cpu"), {"n1": []}) == {"n1": []}  # not ours to judge


def test_preemption_counts_the_daemons_usage_less_the_victims() -> None:
    from devplugin.scheduler.extender import preempt

    v = held(0, 12, name="v")
    st = state_with(node("n1", gpus=1, units=16, usage={0: GpuUsage(mem=12, containers=1)}), pods=(v,))
    assert preempt(st, pod(mem=10), {"n1": [v["metadata"]["uid"]]}) == {"n1": [v["metadata"]["uid"]]}
    # A pod the daemon counts but no annotation names (4 GiB) stays: evicting v leaves 12 free, not 16.
    st.upsert_node(node("n1", gpus=1, units=16, usage={0: GpuUsage(mem=16, containers=2)}))
    assert preempt(st, pod(mem=14), {"n1": [v["metadata"]["uid"]]}) == {}


def test_a_slow_apiserver_write_holds_back_no_other_bind() -> None:
    # Decisions for one node are serialised under its lock; the apiserver write is outside it, so a Binding that
    # hangs delays neither binds to other nodes nor other binds to the same node.
    st = state_with(node("n1", gpus=1, units=16), node("n2", gpus=1, units=16))
    writing, release = threading.Event(), threading.Event()

    class SlowFirst(FakeCluster):
        def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
            if name == "slow":
                writing.set()
                assert release.wait(10)
            super().bind_pod(namespace, name, uid, node, annotations)

    cluster = SlowFirst(st)
    pods = {n: pod(n, mem=4) for n in ("slow", "same-node", "other-node")}
    for p in pods.values():
        st.upsert_pod(p)
    slow = threading.Thread(target=bind, args=(st, cluster, "default", "slow", pods["slow"]["metadata"]["uid"], "n1"))
    slow.start()
    try:
        assert writing.wait(10)
        bind(st, cluster, "default", "same-node", pods["same-node"]["metadata"]["uid"], "n1")
        bind(st, cluster, "default", "other-node", pods["other-node"]["metadata"]["uid"], "n2")
        assert [k for k, _, _ in cluster.bound] == ["default/same-node", "default/other-node"]
        assert st.view("n1").gpus[0].mem_used == 8  # the slow one's room is held meanwhile
    finally:
        release.set()
        slow.join()
    assert len(cluster.bound) == 3


def test_an_init_container_whose_devices_an_app_container_reuses_holds_no_room_of_its_own() -> None:
    # The kubelet hands an init container's devices on to the next app container; the node daemon matches them
    # when the amounts are equal. Both go on one GPU and count once.
    st = state_with(node("n1", gpus=2, units=6), pods=(held(0, 1),))
    cluster = FakeCluster(st)
    p = pod("warm", init=[container("fetch", mem=4, core=0)], containers=[container("main", mem=4)])
    st.upsert_pod(p)
    assert filter_nodes(st, p, ["n1"]).passed == ["n1"]
    bind(st, cluster, "default", "warm", p["metadata"]["uid"], "n1")
    chosen = parse_assignment(cluster.bound[0][2][ANN_SCHEDULED]).containers
    assert chosen["fetch"] == chosen["main"] and chosen["main"][0].index == 0  # binpack: the fuller GPU
    assert [g.mem_used for g in st.view("n1").gpus] == [5, 0]
    # The same from the annotation once bound (a restart reads it back the same way).
    bound = {**p, "spec": {**p["spec"], "nodeName": "n1"},
             "metadata": {**p["metadata"], "annotations": cluster.bound[0][2]}}
    assert [g.mem_used for g in state_with(node("n1", gpus=2, units=6), pods=(bound, held(0, 1))).view("n1").gpus] \
        == [5, 0]
    # Different amounts: the init container ends before the app container starts (the kubelet's effective
    # request is max(3, 4)): both fit GPU 1, which holds 4 for the pod, not 7.
    other = pod("cold", init=[container("fetch", mem=3)], containers=[container("main", mem=4)])
    st.upsert_pod(other)
    assert filter_nodes(st, other, ["n1"]).passed == ["n1"]
    bind(st, cluster, "default", "cold", other["metadata"]["uid"], "n1")
    chosen = parse_assignment(cluster.bound[1][2][ANN_SCHEDULED]).containers
    assert [s.index for s in chosen["fetch"] + chosen["main"]] == [1, 1]
    assert [g.mem_used for g in st.view("n1").gpus] == [5, 4]
    big = pod("hot", init=[container("fetch", mem=3)], containers=[container("main", mem=1)])
    out = filter_nodes(st, big, ["n1"])
    assert out.failed["n1"] == "container 'fetch': GPU 0,1: at most 2 GiB free on one GPU, 3 GiB asked"


def test_a_pod_recorded_container_by_container_keeps_its_other_containers_counted() -> None:
    """The node daemon writes gpushare.io/allocated container by container: while only the first container is
    recorded, the second still holds what the scheduler chose for it (issue 14, defect 1)."""
    two = [container("a", mem=4, core=45), container("b", mem=4, core=55)]
    choice = PodAssignment("n1", 1, {"a": (GpuShare(0, "", 4, 45),), "b": (GpuShare(0, "", 4, 55),)})
    first = PodAssignment("n1", 2, {"a": (GpuShare(0, "", 4, 45),)})
    p = pod("two", containers=two, node_name="n1", phase="Pending",
            annotations={ANN_SCHEDULED: choice.render(), ANN_ALLOCATED: first.render()})
    st = state_with(node("n1", gpus=1, units=16), pods=(p,))
    out = filter_nodes(st, pod("next", mem=1, core=5), ["n1"])
    assert out.passed == [] and "n1" in out.failed  # 45 + 55 % of GPU 0 is taken, not 45
    assert st.held(p["metadata"]["uid"]).source == ANN_SCHEDULED
    both = PodAssignment("n1", 3, {"a": (GpuShare(0, "", 4, 45),), "b": (GpuShare(0, "", 4, 50),)})
    p["metadata"]["annotations"][ANN_ALLOCATED] = both.render()
    st.upsert_pod(p)
    assert st.held(p["metadata"]["uid"]).source == ANN_ALLOCATED
    # a record says where each container is, never how much it takes: b still counts the 55 % it asked for
    assert [(r.mem_used, r.core_used) for r in st.view("n1").gpus] == [(8, 100)]
