"""What the node daemon knows of what its GPUs hold: units come back when pods end without an apiserver, Allocate
rechecks a whole GPU, a late second call joins its container, a refused container is not matched again, a failed
shim write takes nothing, and nothing is served before the kubelet's PodResources answers. Each test is a defect
found when the daemon was tried as a new user would, and failed before its fix."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.errors import PairingConflict, RequestError
from devplugin.allocation.ports import Reporter
from devplugin.allocation.requests import pod_request
from devplugin.allocation.units import Kind, encode_id
from devplugin_sim.kubelet import AdmissionError
from tests.deviceplugin.test_kubelet_admission import pod
from tests.support.daemon_harness import COUNT, MEM, running
from tests.support.nodes import MiniKubelet, make_node


def test_after_a_whole_gpu_pod_ends_shared_pods_fit_again_without_an_apiserver() -> None:
    """Only gpu-count calls show a whole GPU free again; the daemon re-reads PodResources before refusing."""
    with running() as r:
        assert r.registered_all()
        whole = r.kubelet.admit(pod("all", count=4))
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 0, timeout=5)  # all four held whole
        r.kubelet.remove_pod(whole.pod.uid)
        # the kubelet's PodResources is the news: within the node sync's period, the shared units come back
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 60, timeout=10)
        for i in range(4):
            got = r.kubelet.admit(pod(f"s{i}", mem=15, core=50)).containers[0]
            assert got.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "15360m"


def test_after_shared_pods_end_a_whole_gpu_can_be_had_without_an_apiserver() -> None:
    with running() as r:
        assert r.registered_all()
        shared = [r.kubelet.admit(pod(f"s{i}", mem=15, core=5)) for i in range(4)]
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 0, timeout=5)  # every GPU shared
        for s in shared:
            r.kubelet.remove_pod(s.pod.uid)
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 4, timeout=10)
        got = r.kubelet.admit(pod("whole", count=2)).containers[0]
        assert len(got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2


def test_allocate_rechecks_a_whole_gpu_even_when_no_preference_was_asked() -> None:
    """The kubelet skips GetPreferredAllocation at times: Allocate itself refuses a whole GPU that holds slices."""
    node = make_node()
    k = MiniKubelet(node, Allocator(node, pair_window_s=60))
    k.admit({Kind.MEM: 2, Kind.CORE: 10})
    with pytest.raises(PairingConflict, match="holds shared containers"):
        k.allocator.allocate(Kind.COUNT, [encode_id(node.gpus[0].uuid, Kind.COUNT)])
    gpu1 = node.gpus[1].uuid
    k.allocator.allocate(Kind.COUNT, [encode_id(gpu1, Kind.COUNT)])
    with pytest.raises(PairingConflict, match="held whole"):
        k.allocator.allocate(Kind.MEM, [encode_id(gpu1, Kind.MEM, 0)])


class _Pods:
    """A pod cache stand-in: the pods bound to the node."""

    def __init__(self, *pods: dict) -> None:
        self.list = [pod_request(p) for p in pods]

    def pods(self):  # type: ignore[no-untyped-def]
        return self.list

    def fetch_now(self, budget_s: float):  # type: ignore[no-untyped-def]
        return self.list


def _pod(name: str, uid: str, **limits: int) -> dict:
    lim = {f"aliyun.com/{ {'mem': 'gpu-mem', 'core': 'gpu-core.percentage', 'count': 'gpu-count'}[k] }": str(v)
           for k, v in limits.items()}
    return {"metadata": {"name": name, "namespace": "default", "uid": uid,
                         "creationTimestamp": "2026-11-23T07:00:00Z"},
            "spec": {"nodeName": "n", "containers": [{"name": "main", "resources": {"limits": lim}}]},
            "status": {"phase": "Pending"}}


def test_a_late_second_call_still_joins_its_container() -> None:
    """With the container known, the time between its two calls does not matter (the pairing window did)."""
    node = make_node()
    alloc = Allocator(node, pair_window_s=0.01, lookup=_Pods(_pod("a", "u-a", mem=3, core=30),
                                                            _pod("b", "u-b", mem=14, core=10)))
    k = MiniKubelet(node, alloc)
    first = alloc.preferred(Kind.MEM, k.available(Kind.MEM), [], 3)
    mem = alloc.allocate(Kind.MEM, first)
    k.held[Kind.MEM].update(first)
    time.sleep(0.05)
    second = alloc.preferred(Kind.CORE, k.available(Kind.CORE), [], 30)
    grant = alloc.allocate(Kind.CORE, second)
    assert {i.split("::")[0] for i in first + second} == {grant.gpus[0]}
    envs = {**grant.envs, **mem.envs}  # each call says what its own devices say; the kubelet merges them
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3072m" and envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert all(mem.envs[k] == grant.envs[k] for k in set(mem.envs) & set(grant.envs))


def test_a_failed_shim_write_is_a_clear_error_and_takes_nothing(tmp_path: Path) -> None:
    from devplugin.isolation.shim_delivery import shim_provider
    from devplugin.isolation.shim_files import ShimPaths

    lib = tmp_path / "libgpushare.so"
    lib.write_text("")
    (tmp_path / "state").write_text("a file where the state directory should be")
    node = make_node()
    alloc = Allocator(node, pair_window_s=60, mounts=shim_provider(ShimPaths(tmp_path / "state", lib)))
    k = MiniKubelet(node, alloc)
    ids = alloc.preferred(Kind.MEM, k.available(Kind.MEM), [], 2)
    with pytest.raises(RequestError, match="could not write the isolation files.*--shim-state-dir") as err:
        alloc.allocate(Kind.MEM, ids)
    assert err.value.code.name in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED")
    assert alloc.holdings.free(Kind.MEM, node.gpus[0].uuid) == 15  # nothing was committed


def test_not_registered_until_the_kubelets_podresources_answers() -> None:
    """Serving 'everything free' before the held devices are known would give devices twice."""
    missing = Path("/tmp/gs-missing-podresources.sock")
    missing.unlink(missing_ok=True)
    with running(pod_resources_socket=str(missing), kubelet_pod_resources=Path("/tmp/gs-kubelet-pr.sock")) as r:
        time.sleep(1.0)
        assert r.kubelet.allocatable().get(MEM, 0) == 0
        ready, why = r.nd.ready()
        assert not ready and "PodResources" in why
        # the kubelet's PodResources appears where the daemon looks: it registers
        os.symlink(r.pod_resources, missing)
        try:
            assert r.registered_all(timeout=15)
            assert r.nd.ready() == (True, "ok")
        finally:
            missing.unlink()


def test_a_container_refused_by_the_daemon_is_not_matched_again() -> None:
    with running() as r:
        assert r.registered_all()
        with pytest.raises(AdmissionError):
            r.kubelet.admit(pod("bad", mem=1, core=33))
        got = r.kubelet.admit(pod("good", mem=1, core=30)).containers[0]
        assert got.envs["CUDA_DEVICE_SM_LIMIT"] == "30"


class _Told(Reporter):
    def __init__(self) -> None:
        self.refusals: list[tuple[str, str | None, str]] = []

    def refused(self, pod, container, message):  # type: ignore[no-untyped-def]
        self.refusals.append((pod.name if pod else "", container, message))


@pytest.mark.parametrize("first", [Kind.CORE, Kind.MEM])
def test_a_bad_core_request_reaches_its_pod_whichever_resource_the_kubelet_calls_first(first: Kind) -> None:
    node = make_node()
    told = _Told()
    alloc = Allocator(node, pair_window_s=60, lookup=_Pods(_pod("bad", "u-bad", mem=1, core=33)), reporter=told)
    k = MiniKubelet(node, alloc)
    with pytest.raises(RequestError, match="multiple of 5"):
        alloc.preferred(first, k.available(first), [], {Kind.CORE: 33, Kind.MEM: 1}[first])
    [(pod_name, container, message)] = told.refusals
    assert (pod_name, container) == ("bad", "main") and "gpu-core.percentage 33" in message


def test_without_pod_identity_a_mispaired_containers_end_frees_only_its_own_units() -> None:
    """Node-local pairing can put container B's gpu-core.percentage into the decision of container A (memory
    only). When A ends, only A's units are free: B's compute on that GPU must still keep it from a whole-GPU pod
    (bench/churn.py --mode fallback found one GPU given whole while shared)."""
    node = make_node([4, 15])
    k = MiniKubelet(node, Allocator(node, pair_window_s=60))
    gpu0 = node.gpus[0].uuid
    a = k.admit({Kind.MEM: 2})  # A: memory only, on GPU 0 (binpack)
    b = k.admit({Kind.CORE: 30, Kind.MEM: 3}, order=[Kind.CORE, Kind.MEM])  # B's core joins A's decision
    assert b[Kind.CORE].gpus == (gpu0,) and b[Kind.MEM].gpus != (gpu0,)  # B is split: the pairing's known limit
    k.release(a)  # A ends
    k.admit({Kind.MEM: 12})  # a memory call shows A's units free (it fits only GPU 1)
    assert k.allocator.holdings.shared(gpu0)  # B's compute is still there
    with pytest.raises(RequestError):
        k.admit({Kind.COUNT: 1})  # GPU 0 holds B's compute, GPU 1 holds memory: no GPU can be had whole
