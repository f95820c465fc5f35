"""The node daemon knows its pods: the real daemon, the kubelet emulator (real gRPC) and the fake apiserver (the
real `kubernetes` client). Each test checks what an operator or a workload relies on: the container lands where
its pod says, on one GPU, and the pod, its Events and the node say so."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin.allocation.units import Kind
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.kubelet import AdmissionError
from tests.support.daemon_harness import CORE, COUNT, MEM, Running, _until, running


@pytest.fixture
def r(api: FakeApiserver) -> Iterator[Running]:
    with running(apiserver=api) as run:
        assert run.registered_all()
        yield run


def admit(r: Running, pod: dict):  # type: ignore[no-untyped-def]
    assert r.wait_cached(pod)
    return r.admit(pod)


def gpus_of(container) -> set[str]:  # type: ignore[no-untyped-def]
    return {i.split("::")[0] for ids in container.device_ids.values() for i in ids}


def allocated(r: Running, name: str, timeout: float = 5.0) -> dict:
    """The daemon's record on the pod (waits for the background writer)."""
    assert r.api is not None
    r.nd.link.writer.flush(timeout)  # type: ignore[union-attr]
    ok = _until(lambda: c.ANN_ALLOCATED in r.api.pod("default", name)["metadata"].get("annotations", {}), timeout)
    assert ok, f"pod {name} has no {c.ANN_ALLOCATED} annotation"
    return json.loads(r.api.pod("default", name)["metadata"]["annotations"][c.ANN_ALLOCATED])


def events(r: Running, name: str, reason: str | None = None) -> list[dict]:
    assert r.api is not None
    r.nd.link.writer.flush(5)  # type: ignore[union-attr]
    return [e for e in r.api.events if e.get("involvedObject", {}).get("name") == name
            and (reason is None or e.get("reason") == reason)]


def test_two_pods_with_equal_requests_each_get_their_own_record(r: Running) -> None:
    a, b = r.pod("a", mem=8, core=30), r.pod("b", mem=8, core=30)
    ca, cb = admit(r, a).containers[0], admit(r, b).containers[0]
    assert len(gpus_of(ca)) == 1 and len(gpus_of(cb)) == 1
    assert gpus_of(ca) != gpus_of(cb)  # 8 + 8 does not fit on one 15 GiB GPU
    rec_a, rec_b = allocated(r, "a"), allocated(r, "b")
    assert rec_a["containers"]["main"][0]["uuid"] == ca.envs["NVIDIA_VISIBLE_DEVICES"]
    assert rec_b["containers"]["main"][0]["uuid"] == cb.envs["NVIDIA_VISIBLE_DEVICES"]
    assert r.api.pod("default", "a")["metadata"]["annotations"][c.ANN_ALIYUN_ASSIGNED] == "true"
    [ev] = events(r, "a", "GPUAssigned")
    assert ev["type"] == "Normal" and "8 GiB and 30 % of GPU" in ev["message"]


def test_memory_only_core_only_and_both_never_join_each_other(r: Running) -> None:
    """The kubelet calls a container's resources in random order; a container that asks for one resource is
    placed alone and never paired with the next container's other resource."""
    pods = []
    for i in range(12):
        limits = [{"mem": 2}, {"core": 20}, {"mem": 3, "core": 10}][i % 3]
        pods.append((r.pod(f"p{i}", **limits), limits))
    for pod, limits in pods:
        got = admit(r, pod).containers[0]
        assert got.conflicts == []
        assert len(gpus_of(got)) == 1
        assert {k.split("/")[1] for k in got.device_ids} == {
            {"mem": "gpu-mem", "core": "gpu-core.percentage"}[k] for k in limits}
        assert sum(len(v) for v in got.device_ids.values()) == sum(limits.values())
        rec = allocated(r, pod["metadata"]["name"])["containers"]["main"][0]
        assert rec["mem"] == limits.get("mem", 0) and rec["core"] == limits.get("core", 0)


def test_the_scheduler_chose_gpu_2_and_it_is_honoured(r: Running) -> None:
    gpu2 = r.nd.node.gpus[2]
    choice = c.PodAssignment(node="gpu-node", time_ns=time.time_ns(), containers={
        "main": (c.GpuShare(index=2, uuid=gpu2.uuid, mem=4, core=20),)}).render()
    pod = r.pod("chosen", mem=4, core=20, annotations={c.ANN_SCHEDULED: choice})
    got = admit(r, pod).containers[0]
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == gpu2.uuid
    assert "gpushare.io/scheduled" in events(r, "chosen", "GPUAssigned")[0]["message"]


def test_alibaba_index_honoured_and_a_full_choice_overridden_with_a_warning(r: Running) -> None:
    got = admit(r, r.pod("ali", mem=12, annotations={c.ANN_ALIYUN_MEM_IDX: "3"})).containers[0]
    assert got.envs["ALIYUN_COM_GPU_MEM_IDX"] == "3"
    # GPU 3 now has 3 GiB free: a pod sent there for 5 GiB is placed elsewhere, and the pod says why
    got = admit(r, r.pod("late", mem=5, annotations={c.ANN_ALIYUN_MEM_IDX: "3"})).containers[0]
    assert got.envs["ALIYUN_COM_GPU_MEM_IDX"] != "3"
    [warn] = events(r, "late", "GPUChoiceOverridden")
    assert warn["type"] == "Warning"
    assert "GPU 3" in warn["message"] and f"GPU {got.envs['ALIYUN_COM_GPU_MEM_IDX']}" in warn["message"]


def test_a_multi_container_pod_places_each_container_on_its_own_request(r: Running) -> None:
    pod = r.pod("multi", containers=[{"name": "big", "limits": {"mem": 10, "core": 50}},
                                     {"name": "small", "limits": {"mem": 4, "core": 20}}])
    res = admit(r, pod)
    big, small = res.container("big"), res.container("small")
    assert sum(len(v) for k, v in big.device_ids.items() if k == MEM) == 10
    assert sum(len(v) for k, v in small.device_ids.items() if k == MEM) == 4
    rec = allocated(r, "multi")["containers"]
    assert rec["big"][0]["mem"] == 10 and rec["small"][0]["mem"] == 4


def test_an_init_containers_devices_are_reused_without_counting_twice(r: Running) -> None:
    pod = r.pod("init", init=[{"name": "warmup", "limits": {"mem": 4, "core": 20}}],
                containers=[{"name": "app", "limits": {"mem": 4, "core": 20}}])
    res = admit(r, pod)
    warmup, app = res.init_containers[0], res.container("app")
    reused = {k: set(v) for k, v in app.device_ids.items()}
    assert reused == {k: set(v) for k, v in warmup.device_ids.items()}  # the kubelet reused them
    assert gpus_of(app) == gpus_of(warmup)
    uuid = next(iter(gpus_of(app)))
    assert r.nd.allocator.holdings.used(Kind.MEM, uuid) == 4  # one set of devices, counted once
    rec = allocated(r, "init")["containers"]
    assert set(rec) == {"warmup", "app"}


def test_a_whole_gpu_leaves_the_shared_pool_and_comes_back(r: Running) -> None:
    assert r.kubelet.allocatable()[MEM] == 60
    whole = r.pod("whole", count=1)
    got = admit(r, whole).containers[0]
    assert len(gpus_of(got)) == 1
    assert r.kubelet.wait_for(lambda k: k.allocatable()[MEM] == 45, timeout=5)
    rec = allocated(r, "whole")["containers"]["main"][0]
    assert rec["whole"] is True and rec["mem"] == 15
    # the pod ends: the kubelet forgets it, the apiserver says so, and the units come back
    r.kubelet.remove_pod(whole["metadata"]["uid"])
    r.api.set_pod_phase("default", "whole", "Succeeded")
    assert r.kubelet.wait_for(lambda k: k.allocatable()[MEM] == 60, timeout=5)
    # and a shared pod may now use every GPU again (not "held whole")
    for i in range(4):
        admit(r, r.pod(f"s{i}", mem=15))


def test_a_gpu_holding_slices_is_not_given_whole(r: Running) -> None:
    admit(r, r.pod("slice", mem=1, core=5))
    assert r.kubelet.wait_for(lambda k: k.allocatable()[COUNT] == 3, timeout=5)
    with pytest.raises(AdmissionError, match="Requested: 4, Available: 3"):
        admit(r, r.pod("four", count=4))


def test_multi_gpu_sharing_splits_a_container_over_n_gpus(r: Running) -> None:
    got = admit(r, r.pod("split", mem=8, core=40, labels={c.LABEL_ACK_MULTI_GPU: "2"})).containers[0]
    per_gpu: dict[str, int] = {}
    for i in got.device_ids[MEM]:
        per_gpu[i.split("::")[0]] = per_gpu.get(i.split("::")[0], 0) + 1
    assert sorted(per_gpu.values()) == [4, 4]
    assert got.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == got.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4096m"
    assert got.envs["CUDA_DEVICE_SM_LIMIT"] == "20"
    assert len(got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2


def test_multi_gpu_amounts_that_do_not_split_are_refused_with_advice(r: Running) -> None:
    with pytest.raises(AdmissionError, match="do not split evenly over 2 GPUs; ask for a multiple of 2"):
        admit(r, r.pod("odd", mem=5, labels={c.LABEL_ACK_MULTI_GPU: "2"}))
    [warn] = events(r, "odd", "GPUAllocationFailed")
    assert "multiple of 2" in warn["message"]


def test_a_refusal_is_a_warning_event_that_says_what_to_change(r: Running) -> None:
    with pytest.raises(AdmissionError):
        admit(r, r.pod("huge", mem=16, core=10))
    [warn] = events(r, "huge", "GPUAllocationFailed")
    assert warn["type"] == "Warning" and "no GPU of this node has room for 16 GiB" in warn["message"]
    assert "lower the request" in warn["message"]


def test_node_publishes_its_gpus_and_the_room_in_use(r: Running) -> None:
    admit(r, r.pod("u", mem=5, core=25))

    def usage() -> dict | None:
        raw = r.api.node("gpu-node")["metadata"].get("annotations", {}).get(c.ANN_NODE_USAGE)
        return json.loads(raw) if raw else None

    # The kubelet asks for a container's resources one after another and the daemon may publish in between (a
    # usage with the gpu-mem held and the core not yet: true at its time), so wait for the whole container.
    want = {"mem": 5, "core": 25, "containers": 1, "whole": False}
    assert _until(lambda: (usage() or {}).get("gpus", {}).get("0") == want, 5), usage()
    inv = c.parse_inventory(r.api.node("gpu-node")["metadata"]["annotations"][c.ANN_NODE_GPUS])
    assert inv.mode == "core_mem" and [g.mem_units for g in inv.gpus] == [15] * 4


def test_apiserver_down_falls_back_within_the_budget_and_names_the_pod_once_back(r: Running) -> None:
    r.api.down()
    pod = r.api.add_pod(name="blind", node_name="gpu-node", limits={MEM: "3", CORE: "20"})  # the cache is blind
    t0 = time.monotonic()
    got = r.admit(pod).containers[0]
    took = time.monotonic() - t0
    assert len(gpus_of(got)) == 1
    assert took < 1.0, f"admission took {took:.2f} s with the apiserver down (budget 0.3 s)"
    r.api.up()
    assert r.wait_cached(pod, timeout=15)
    assert r.nd.sync.sync()  # what the daemon's periodic node sync does
    rec = allocated(r, "blind", timeout=10)
    assert rec["containers"]["main"][0]["mem"] == 3 and rec["containers"]["main"][0]["core"] == 20
    assert events(r, "blind", "PlacedWithoutPodLookup")


def test_a_decision_not_written_before_a_crash_is_written_after_restart(api: FakeApiserver) -> None:
    with running(apiserver=api) as r:
        assert r.registered_all()
        pod = r.pod("crash", mem=2, core=10)
        assert r.wait_cached(pod)
        r.nd.link.writer.stop(flush_timeout_s=0)  # the patch queue dies with the process
        r.nd.link.writer._queue.clear()  # noqa: SLF001 - what a SIGKILL does to it
        r.admit(pod)
        time.sleep(0.2)
        assert c.ANN_ALLOCATED not in api.pod("default", "crash")["metadata"].get("annotations", {})
        from devplugin.kube.client import load_api_client
        from devplugin.kube.writer import KubeWriter

        r.nd.link.writer = KubeWriter(load_api_client(api.kubeconfig_path), "gpu-node").start()
        r.restart_daemon()
        assert r.registered_all()
        rec = allocated(r, "crash", timeout=10)
        assert rec["containers"]["main"][0]["mem"] == 2 and rec["containers"]["main"][0]["core"] == 10


def test_a_container_a_restarted_kubelet_forgot_is_placed_again_as_itself(r: Running) -> None:
    """A kubelet that stops after a container's Allocate but before writing its checkpoint forgets the allocation
    and, restarted, admits the pod again. The container asks again though the daemon recorded it: it is the same
    container, placed where its pod says and named, not an unknown one placed by node-local pairing (which put it
    on another GPU than its record, or refused the next container of the pair it broke)."""
    gpu2 = r.nd.node.gpus[2]
    choice = c.PodAssignment(node="gpu-node", time_ns=time.time_ns(), containers={
        "main": (c.GpuShare(index=2, uuid=gpu2.uuid, mem=4, core=20),)}).render()
    pod = r.pod("forgotten", mem=4, core=20, annotations={c.ANN_SCHEDULED: choice})
    assert admit(r, pod).containers[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpu2.uuid
    before = allocated(r, "forgotten")["containers"]["main"][0]
    r.kubelet.remove_pod(pod["metadata"]["uid"])  # the allocation never reached the checkpoint
    r.kubelet.restart()
    assert r.registered_all()
    got = r.admit(pod).containers[0]  # the restarted kubelet admits the pod again
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == gpu2.uuid
    assert got.conflicts == []
    named = [h.key for h in r.nd.allocator.holdings.holders()]
    assert None not in named, "the container was placed without its identity"
    assert [(k.pod, k.container) for k in named] == [("forgotten", "main")]
    after = allocated(r, "forgotten")["containers"]["main"][0]
    assert (after["uuid"], after["mem"], after["core"]) == (before["uuid"], before["mem"], before["core"])
    uuid = gpu2.uuid
    assert r.nd.allocator.holdings.used(Kind.MEM, uuid) == 4  # counted once
