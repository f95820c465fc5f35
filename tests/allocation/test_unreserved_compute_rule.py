"""A container that asks for gpu-mem and no gpu-core.percentage on a core_mem node runs only on compute nobody
reserved: one rule in the node daemon (placement, limits file, env), the scheduler extender (fit) and the
validating webhook (a warning), docs/guide/modes.md. The shares it then gets are measured in
tests/shim/test_share_unreserved.py."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplugin import contract
from devplugin.allocation.allocator import Allocator
from devplugin.allocation.errors import NoRoom
from devplugin.allocation.requests import pod_request
from devplugin.allocation.units import Kind, decode_id
from devplugin.isolation.shim_delivery import shim_provider
from devplugin.isolation.shim_files import ShimPaths, merge_limits
from devplugin.scheduler.admission import validate
from devplugin.scheduler.fit import NodeView, ask_of, fit
from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.room import GpuRoom
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster
from tests.scheduler.test_http import review
from tests.support.nodes import MiniKubelet, make_node
from tests.support.scheduler_objects import node, pod

with warnings.catch_warnings():  # Starlette's note about the HTTP library under its test client
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

NAMES = {Kind.MEM: "aliyun.com/gpu-mem", Kind.CORE: "aliyun.com/gpu-core.percentage"}
CORE_NAME = NAMES[Kind.CORE]


class Pods:
    """The pod cache stand-in."""

    def __init__(self) -> None:
        self.items: list = []

    def pods(self):  # type: ignore[no-untyped-def]
        return list(self.items)

    def fetch_now(self, budget_s: float):  # type: ignore[no-untyped-def]
        return self.pods()


class Node:
    """A node daemon's allocator behind a miniature kubelet, with the pods it admits known to it."""

    def __init__(self, tmp: Path, gpus: int = 2, mode: str = "core_mem", lookup: bool = True) -> None:
        self.node = make_node([15] * gpus, mode=mode)
        self.pods = Pods()
        self.kubelet = MiniKubelet(self.node, Allocator(self.node, pair_window_s=60,
                                                        lookup=self.pods if lookup else None,
                                                        mounts=shim_provider(ShimPaths(tmp, Path("/bin/true")))))

    def admit(self, name: str, mem: int, core: int = 0):  # type: ignore[no-untyped-def]
        request = {k: n for k, n in ((Kind.MEM, mem), (Kind.CORE, core)) if n}
        limits = {NAMES[k]: str(n) for k, n in request.items()}
        self.pods.items.append(pod_request({"metadata": {"name": name, "namespace": "default", "uid": name},
                                            "spec": {"nodeName": "n", "containers": [
                                                {"name": "main", "resources": {"limits": limits}}]}}))
        return self.kubelet.admit(request)

    def gpu(self, grant) -> int:  # type: ignore[no-untyped-def]
        return self.node.by_uuid[grant.gpus[0]].index


def limits_of(grant) -> contract.DeviceLimit:  # type: ignore[no-untyped-def]
    path = next(m.host_path for m in grant.mounts if m.container_path == contract.CONTAINER_LIMITS_PATH)
    return contract.parse_limits(Path(path).read_text()).devices[0]


# ---------------------------------------------------------------------------------------------- the node daemon

def test_it_gets_at_most_the_compute_nobody_reserved_and_gives_way(tmp_path) -> None:
    n = Node(tmp_path)
    n.admit("paid", mem=4, core=70)
    grant = n.admit("memonly", mem=2)[Kind.MEM]
    assert n.gpu(grant) == 0
    assert limits_of(grant) == contract.DeviceLimit(n.node.gpus[0].uuid, 2 << 30, 30, sm_unreserved=True)
    assert grant.envs[contract.ENV_SM_LIMIT] == "30"  # HAMi-core's libvgpu.so reads the cap from the env


def test_it_never_goes_to_a_gpu_whose_compute_is_all_reserved(tmp_path) -> None:
    n = Node(tmp_path)
    n.admit("paid0", mem=4, core=100)  # GPU 0: all compute reserved; binpack would put memory there
    grant = n.admit("memonly", mem=2)[Kind.MEM]
    assert n.gpu(grant) == 1
    assert limits_of(grant).sm_limit == 100 and limits_of(grant).sm_unreserved


def test_it_is_refused_when_every_gpu_with_room_has_its_compute_reserved(tmp_path) -> None:
    n = Node(tmp_path)
    n.admit("paid0", mem=4, core=100)
    n.admit("paid1", mem=4, core=100)
    with pytest.raises(NoRoom) as refused:
        n.admit("memonly", mem=2)
    assert refused.value.reason == "no_unreserved_compute"
    assert f"asks for no {CORE_NAME}" in str(refused.value) and f"ask for {CORE_NAME}" in str(refused.value)
    assert "cgpu node" in str(refused.value)


def test_placed_without_its_pod_it_follows_the_same_rule(tmp_path) -> None:
    # no pod lookup (node-local pairing): the gpu-mem call cannot know whether a gpu-core.percentage call follows
    n = Node(tmp_path, lookup=False)
    n.admit("paid0", mem=4, core=100)
    grant = n.admit("memonly", mem=2)[Kind.MEM]
    assert n.gpu(grant) == 1 and limits_of(grant).sm_unreserved
    n.admit("paid1", mem=2, core=100)
    with pytest.raises(NoRoom, match="no compute nobody reserved"):
        n.admit("memonly2", mem=2)


def test_a_share_that_follows_replaces_the_cap_whichever_call_came_first() -> None:
    unpaid = contract.Limits(devices=(contract.DeviceLimit("GPU-1", 1 << 30, 30, sm_unreserved=True),))
    paid = contract.Limits(devices=(contract.DeviceLimit("GPU-1", 0, 40),))
    for merged in (merge_limits(unpaid, paid), merge_limits(paid, unpaid)):
        assert merged.devices == (contract.DeviceLimit("GPU-1", 1 << 30, 40),)


def test_on_a_cgpu_node_nothing_changes(tmp_path) -> None:
    n = Node(tmp_path, mode="cgpu")
    grant = n.admit("memonly", mem=2)[Kind.MEM]
    assert limits_of(grant) == contract.DeviceLimit(n.node.gpus[0].uuid, 2 << 30, 100)
    assert contract.ENV_SM_LIMIT not in grant.envs


# ---------------------------------------------------------------------------------------------- the extender

def view(mode: str, cores: list[int], mem_used: list[int] | None = None) -> NodeView:
    rooms = tuple(GpuRoom(i, f"GPU-{i}", 15, mem_used=(mem_used or [0] * len(cores))[i], core_used=c)
                  for i, c in enumerate(cores))
    return NodeView("n1", mode, "binpack", 1024, rooms)


def test_the_extender_places_it_only_where_some_compute_is_unreserved() -> None:
    memonly = ask_of(pod_request(pod(mem=2)))
    placed = fit(memonly, view("core_mem", [100, 40], mem_used=[4, 0]))
    assert placed.ok and placed.containers["main"][0].index == 1  # binpack alone would take the fuller GPU 0
    assert placed.containers["main"][0].core == 0  # it reserves none
    refused = fit(memonly, view("core_mem", [100, 100]))
    assert not refused.ok and not refused.unresolvable  # room may come back: kube-scheduler tries other nodes
    assert "compute nobody reserved" in refused.reason and "ask for gpu-core.percentage" in refused.reason
    assert fit(memonly, view("cgpu", [100, 100])).ok
    two = ask_of(pod_request(pod(mem=4, labels={"aliyun.com/gpu-count": "2"})))
    assert not fit(two, view("core_mem", [100, 0, 100])).ok and fit(two, view("core_mem", [95, 0, 100])).ok


@settings(max_examples=150, deadline=None)
@given(shares=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 6), st.sampled_from([5, 20, 40, 60, 100])),
                       max_size=6), mem=st.integers(1, 8))
def test_the_daemon_and_the_extender_agree_on_where_it_may_go(tmp_path_factory, shares, mem) -> None:
    # the same paid shares on a 2-GPU core_mem node: the node daemon admits the memory-only container exactly
    # when the extender's fit finds it a GPU, and on a GPU the extender would also take
    n = Node(tmp_path_factory.mktemp("node"))
    mem_used, core_used = [0, 0], [0, 0]
    for k, (gpu, m, core) in enumerate(shares):
        if core_used[gpu] + core > 100 or mem_used[gpu] + m > 15:
            continue
        n.pods.items.append(pod_request({"metadata": {"name": f"p{k}", "namespace": "default", "uid": f"p{k}",
                                                      "annotations": {contract.ANN_ALIYUN_MEM_IDX: str(gpu)}},
                                         "spec": {"nodeName": "n", "containers": [{"name": "main", "resources": {
                                             "limits": {NAMES[Kind.MEM]: str(m), CORE_NAME: str(core)}}}]}}))
        grants = n.kubelet.admit({Kind.MEM: m, Kind.CORE: core})
        assert n.gpu(grants[Kind.MEM]) == gpu
        mem_used[gpu] += m
        core_used[gpu] += core
    placed = fit(ask_of(pod_request(pod(mem=mem))), view("core_mem", core_used, mem_used))
    try:
        grant = n.admit("memonly", mem=mem)[Kind.MEM]
    except NoRoom:
        assert not placed.ok, placed
        return
    assert placed.ok, placed.reason
    gpu = decode_id(grant.device_ids[0])[0]
    index = n.node.by_uuid[gpu].index
    assert core_used[index] <= 95 and mem_used[index] + mem <= 15


# ---------------------------------------------------------------------------------------------- the webhook

def test_the_webhook_tells_what_such_a_container_gets_on_a_core_mem_node() -> None:
    verdict = validate(pod(mem=2), largest_gpu_units=15, compute_shares=True)
    assert verdict.allowed  # valid: it may go to a cgpu or share node
    [warning] = verdict.warnings
    assert "compute nobody reserved" in warning and f"add {CORE_NAME}" in warning and "'main'" in warning
    assert validate(pod(mem=2, core=30), largest_gpu_units=15, compute_shares=True).warnings == ()
    assert validate(pod(mem=2), largest_gpu_units=15, compute_shares=False).warnings == ()


@pytest.mark.parametrize("modes, warned", [(("core_mem", "cgpu"), True), (("cgpu", "share"), False)])
def test_the_webhook_warns_only_where_the_cluster_has_a_core_mem_node(modes, warned) -> None:
    state = ClusterState()
    state.replace_nodes([node(f"n{i}", mode=m) for i, m in enumerate(modes)])
    http = TestClient(build_app(Service(state, FakeCluster(state), max_body=64 * 1024)))
    answer = http.post("/admission/validate", json=review(pod(mem=2))).json()["response"]
    assert answer["allowed"] is True
    assert bool(answer.get("warnings")) is warned, answer
