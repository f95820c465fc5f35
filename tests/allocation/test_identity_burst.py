"""Pods admitted in a burst (a Deployment scaled up, a Job's parallelism, a scheduler catching up): many pending
containers ask alike, and the extender's assume times are not the order the pods reach the kubelet (its binds run
in parallel). The real daemon, the kubelet emulator (which, like the kubelet, lists a container's first resource in
PodResources before asking for its next one) and the fake apiserver (issue 14, defect 0)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import seed_node
from devplugin_sim.kubelet import AdmissionError
from tests.support.daemon_harness import CORE, COUNT, MEM, Running, _until, running

GPUS, GIB_PER_GPU = 8, 80


@pytest.fixture
def r(api: FakeApiserver) -> Iterator[Running]:
    with running(seed_node(GPUS, GIB_PER_GPU * 1024), apiserver=api) as run:
        assert run.registered_all()
        yield run


def choice(r: Running, container: str, gpu: int, assumed_ns: int, mem: int = 0, core: int = 0,
           whole: bool = False) -> dict[str, str]:
    """The extender's annotation: where it chose to put the container, and when it assumed the pod."""
    share = c.GpuShare(gpu, "", mem, core, whole)
    return {c.ANN_SCHEDULED: c.PodAssignment(r.node_name, assumed_ns, {container: (share,)}).render()}


def gpu_of(device_id: str) -> str:
    return device_id.split("::")[0]


def check_container(got, name: str) -> tuple[str, int, int]:  # type: ignore[no-untyped-def]
    """(GPU, mem units, core %) the kubelet gave the container; asserts it is on one GPU and its envs say so."""
    gpus = {gpu_of(i) for ids in got.device_ids.values() for i in ids}
    assert len(gpus) == 1, f"{name}: split over {sorted(gpus)}: {got.device_ids}"
    [gpu] = gpus
    mem, core = len(got.device_ids.get(MEM, ())), len(got.device_ids.get(CORE, ()))
    assert got.conflicts == [], f"{name}: its resources set different envs: {got.conflicts}"
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == gpu, f"{name}: told another GPU than it holds"
    if mem:
        assert got.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{mem * 1024}m", f"{name}: memory limit of another"
    if core:
        assert got.envs["CUDA_DEVICE_SM_LIMIT"] == str(core), f"{name}: compute limit of another"
    return gpu, mem, core


def records_agree(r: Running, held: dict[str, tuple[str, int, int]], timeout: float = 10.0) -> dict:
    """Every pod's gpushare.io/allocated says what the kubelet gave it (the daemon may first have to read
    PodResources to name a container placed as the likeliest of several); returns the disagreements."""
    assert r.api is not None and r.nd is not None

    def wrong() -> dict:
        out = {}
        for name, (gpu, mem, core) in held.items():
            raw = r.api.pod("default", name)["metadata"].get("annotations", {}).get(c.ANN_ALLOCATED)
            got = json.loads(raw)["containers"].get("main") if raw else None
            if not got or len(got) != 1 or (got[0]["uuid"], got[0]["mem"], got[0]["core"]) != (gpu, mem, core):
                out[name] = got
        return out

    def settled() -> bool:
        r.nd.link.writer.flush(2)  # type: ignore[union-attr]
        return not wrong()

    _until(settled, timeout)
    return wrong()


def end_pods(r: Running, names: list[str], uids: dict[str, str]) -> None:
    assert r.api is not None and r.nd is not None
    for name in names:
        r.kubelet.remove_pod(uids[name])
        r.api.delete_pod("default", name)
    cache = r.nd.link.pods
    assert _until(lambda: all(cache.get(uids[n]) is None for n in names), 10)  # type: ignore[union-attr]


@pytest.mark.parametrize("kubelet_order", ["as bound", "shuffled"])
def test_bursts_of_24_pods_are_never_split_and_their_envs_match_their_devices(r: Running,
                                                                            kubelet_order: str) -> None:
    """24 one-container pods at once (gpu-core.percentage 30, gpu-mem 1 to 24 GiB each), the extender's choices
    assumed in another order than the pods were bound, five rounds: no container on two GPUs, no container told a
    limit or a GPU it does not hold, every pod's record equal to what the kubelet gave it. "shuffled": the kubelet
    admits in an order the pod watch did not show (the daemon's first guess is often wrong; PodResources
    corrects it)."""
    rng = random.Random(14)
    refused = []
    for rnd in range(5):
        mems = [rng.randint(1, 24) for _ in range(24)]
        assumed = list(range(24))
        rng.shuffle(assumed)  # parallel binds: assume times in another order than the Bindings reached the node
        pods, uids = [], {}
        base = time.time_ns()
        for i, mem in enumerate(mems):
            name = f"b{rnd}-{i}"
            ann = choice(r, "main", i // 3, base + assumed[i], mem=mem, core=30)
            pods.append(r.pod(name, mem=mem, core=30, annotations=ann))
            uids[name] = pods[-1]["metadata"]["uid"]
        assert all(r.wait_cached(pod) for pod in pods)
        order = list(pods)
        if kubelet_order == "shuffled":
            rng.shuffle(order)
        held = {}
        for pod in order:
            name = pod["metadata"]["name"]
            try:
                got = r.admit(pod).containers[0]  # type: ignore[attr-defined]
            except AdmissionError as exc:
                refused.append((name, str(exc)))
                continue
            held[name] = check_container(got, name)
            assert held[name][1:] == (mems[int(name.split("-")[1])], 30)
        per_gpu: dict[str, list[int]] = {}
        for gpu, mem, core in held.values():
            per_gpu.setdefault(gpu, [0, 0])
            per_gpu[gpu][0] += mem
            per_gpu[gpu][1] += core
        assert all(m <= GIB_PER_GPU and k <= 100 for m, k in per_gpu.values()), per_gpu
        assert records_agree(r, held) == {}
        end_pods(r, list(uids), uids)
    if kubelet_order == "as bound":
        assert refused == []
    else:  # a wrong first guess keeps the container on its first resource's GPU, or refuses it: 30 % + 30 % ...
        assert len(refused) <= 6, refused
        assert all("asks alike" in why or "no GPU" in why or "offers only" in why for _, why in refused), refused


def test_two_whole_gpu_pods_bound_24_ms_apart_never_get_each_others_gpu(r: Running) -> None:
    """The extender assumed b before a, but a was bound (and reached the kubelet) first. When a ends, the GPU b
    holds stays b's: a shared pod the extender sends there is placed elsewhere."""
    now = time.time_ns()
    a = r.pod("a", count=1, annotations=choice(r, "main", 0, now + 24_000_000, whole=True))
    time.sleep(0.024)
    b = r.pod("b", count=1, annotations=choice(r, "main", 1, now, whole=True))
    cache = r.nd.link.pods  # type: ignore[union-attr]
    assert _until(lambda: cache.get(a["metadata"]["uid"]) and cache.get(b["metadata"]["uid"]), 10)
    got_a = r.admit(a).containers[0]  # type: ignore[attr-defined]
    got_b = r.admit(b).containers[0]  # type: ignore[attr-defined]
    gpu_a, gpu_b = gpu_of(got_a.device_ids[COUNT][0]), gpu_of(got_b.device_ids[COUNT][0])
    assert got_a.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_a and got_b.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_b
    assert gpu_a == r.driver.gpus[0].uuid and gpu_b == r.driver.gpus[1].uuid  # each where the extender chose

    def record(name: str) -> str | None:
        raw = r.api.pod("default", name)["metadata"].get("annotations", {}).get(c.ANN_ALLOCATED)  # type: ignore
        return json.loads(raw)["containers"]["main"][0]["uuid"] if raw else None

    def recorded() -> bool:
        r.nd.link.writer.flush(2)  # type: ignore[union-attr]
        return (record("a"), record("b")) == (gpu_a, gpu_b)

    assert _until(recorded, 10), (record("a"), record("b"))
    end_pods(r, ["a"], {"a": a["metadata"]["uid"]})
    shared = r.pod("s", mem=8, core=50, annotations=choice(r, "main", 1, time.time_ns(), mem=8, core=50))
    assert r.wait_cached(shared)
    got = r.admit(shared).containers[0]  # type: ignore[attr-defined]
    assert {gpu_of(i) for ids in got.device_ids.values() for i in ids} != {gpu_b}


def test_a_container_placed_as_the_likeliest_is_recorded_even_when_the_kubelet_records_it_late(
        r: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two whole-GPU pods pending at once ask alike: the first call's container is a guess, recorded on its pod
    once the kubelet's PodResources names it. A loaded kubelet records an Allocate some time after the daemon
    answered (here 0.3 s): the daemon reads PodResources again until it does, not once."""
    from devplugin_sim.kubelet_endpoint import PluginEndpoint

    answered = PluginEndpoint.allocate

    def slow(self: PluginEndpoint, device_ids: list[str]):  # type: ignore[no-untyped-def]
        resp = answered(self, device_ids)
        time.sleep(0.3)  # the answer reaches the kubelet's device manager late
        return resp

    monkeypatch.setattr(PluginEndpoint, "allocate", slow)
    now = time.time_ns()
    a = r.pod("a", count=1, annotations=choice(r, "main", 0, now, whole=True))
    b = r.pod("b", count=1, annotations=choice(r, "main", 1, now + 1, whole=True))
    cache = r.nd.link.pods  # type: ignore[union-attr]
    assert _until(lambda: cache.get(a["metadata"]["uid"]) and cache.get(b["metadata"]["uid"]), 10)
    got = {name: gpu_of(r.admit(p).containers[0].device_ids[COUNT][0])  # type: ignore[attr-defined]
           for name, p in (("a", a), ("b", b))}

    def record(name: str) -> str | None:
        raw = r.api.pod("default", name)["metadata"].get("annotations", {}).get(c.ANN_ALLOCATED)  # type: ignore
        return json.loads(raw)["containers"]["main"][0]["uuid"] if raw else None

    def recorded() -> bool:
        r.nd.link.writer.flush(2)  # type: ignore[union-attr]
        return {n: record(n) for n in got} == got

    # well within the daemon's periodic sync (30 s): the record follows the admission
    assert _until(recorded, 5), ({n: record(n) for n in got}, got)
