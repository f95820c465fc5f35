"""Per-container GPU use on /metrics: the real daemon (kubelet emulator, fake apiserver) delivers the shim's files,
the real shim runs over the fake driver in each container's processes, and the daemon's /metrics shows what each
container uses beside what it was given, and nothing once the container ended."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devplugin import contract
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.support.daemon_harness import Running, running
from tests.support.shim_probe import FAKE_CUDA, FAKE_NVML, SHIM, GiB, go_on, next_step, require_built, start, until

Samples = dict[str, dict[tuple[str, str], float]]  # metric -> (pod, GPU UUID) -> value


def scrape(r: Running) -> Samples:
    with urllib.request.urlopen(r.metrics_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("gpushare_container_"):
                out.setdefault(s.name, {})[(s.labels["pod"], s.labels["uuid"])] = s.value
    return out


def poll(r: Running, want: Callable[[Samples], bool], what: str, timeout: float = 5.0) -> Samples:
    """Scrape until `want` holds; fail with the last figures seen."""
    deadline = time.monotonic() + timeout
    while True:
        seen = scrape(r)
        if want(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"/metrics never showed {what} within {timeout} s; last seen: {seen}")
        time.sleep(0.05)


@pytest.fixture
def r(api: FakeApiserver) -> Iterator[Running]:
    require_built()
    with running(apiserver=api, health_port=0, shim="on", shim_lib=str(SHIM)) as run:
        assert run.registered_all()
        yield run


def admit(r: Running, name: str, **limits: int) -> tuple[dict, object]:
    pod = r.pod(name, **limits)
    assert r.wait_cached(pod)
    return pod, r.admit(pod).containers[0]  # type: ignore[attr-defined]


def container_env(r: Running, allocated: object) -> dict[str, str]:
    """The env a process of this container sees: its mounts' host paths in place of the container paths."""
    mounts = {m.container_path: m.host_path for m in allocated.mounts}  # type: ignore[attr-defined]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPUSHARE_", "LD_"))}
    env.update(r.driver.env())
    env.update({
        "GS_PROBE_LIBCUDA": str(FAKE_CUDA), "GS_PROBE_LIBNVML": str(FAKE_NVML),
        contract.ENV_REAL_LIBCUDA: str(FAKE_CUDA), contract.ENV_REAL_LIBNVML: str(FAKE_NVML),
        contract.ENV_LIMITS_FILE: mounts[contract.CONTAINER_LIMITS_PATH],
        contract.ENV_SHARED_CACHE: mounts[contract.CONTAINER_SHARED_CACHE],
        contract.ENV_GPU_LOCK_DIR: mounts[contract.CONTAINER_GPU_LOCK_DIR],
        contract.ENV_CONTEXT_RESERVE: "0",
        "CUDA_VISIBLE_DEVICES": allocated.envs[contract.ENV_NVIDIA_VISIBLE_DEVICES],  # type: ignore[attr-defined]
        "LD_PRELOAD": str(SHIM),
        # kernels of 1000 blocks x 1 us on the fake GPU's timeline, as the compute-share tests run them
        "FAKE_CUDA_NS_PER_BLOCK": "1000", "FAKE_CUDA_QUEUE_US": "20000",
    })
    return env


def stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_each_container_s_use_beside_its_allocation_and_gone_once_it_ended(r: Running) -> None:
    full_pod, full = admit(r, "full", mem=2, core=50)
    _, idle = admit(r, "idle", mem=3, core=30)
    gpu = full.envs[contract.ENV_NVIDIA_VISIBLE_DEVICES]  # type: ignore[attr-defined]
    assert idle.envs[contract.ENV_NVIDIA_VISIBLE_DEVICES] == gpu  # type: ignore[attr-defined]  # binpack
    f, i = ("full", gpu), ("idle", gpu)
    # Before any process: what each was given, nothing used.
    seen = poll(r, lambda m: m.get("gpushare_container_memory_limit_bytes", {}).get(f) == 2 * GiB, "the limits")
    assert seen["gpushare_container_memory_limit_bytes"][i] == 3 * GiB
    assert seen["gpushare_container_compute_share_percent"] == {f: 50, i: 30}
    assert seen["gpushare_container_memory_used_bytes"] == {f: 0, i: 0}

    filler = start(container_env(r, full), "init", "ctx", 0, "fill", "alloc", "256m", "ready",
                   "launchfor", "launch", 3000, 1000, "ready")
    sitter = start(container_env(r, idle), "init", "ctx", 0, "ready")
    try:
        filled = until(filler, "ready")[-2]
        assert filled["bytes"] == 2 * GiB  # the cap held
        until(sitter, "ready")
        seen = poll(r, lambda m: m["gpushare_container_memory_used_bytes"].get(f) == 2 * GiB
                    and m["gpushare_container_memory_refusals_total"].get(f) == 1
                    and m["gpushare_container_processes"].get(i) == 1, "2 GiB used and one refusal", timeout=1.0)
        assert seen["gpushare_container_memory_used_bytes"][i] == 0
        assert seen["gpushare_container_memory_refusals_total"][i] == 0
        assert seen["gpushare_container_processes"][f] == 1
        # The filler launches for 3 s at a 50 % share: its compute use shows; the idle one stays at 0.
        go_on(filler)
        seen = poll(r, lambda m: m.get("gpushare_container_compute_used_percent", {}).get(f, 0) >= 20,
                    "the filler's compute use", timeout=3.0)
        assert seen["gpushare_container_compute_used_percent"][i] == 0
        assert seen["gpushare_container_compute_used_percent"][f] <= 100
        ran = next_step(filler)
        assert ran["op"] == "launchfor" and ran["rc"] == 0, ran
        throttled = poll(r, lambda m: m["gpushare_container_throttled_seconds_total"].get(f, 0) > 0,
                         "the filler's throttled time", timeout=1.0)
        assert throttled["gpushare_container_throttled_seconds_total"][i] == 0
    finally:
        stop(filler, sitter)
    # The filler's pod ends: its series go, the idle container's stay.
    r.kubelet.remove_pod(full_pod["metadata"]["uid"])
    assert r.api is not None
    r.api.set_pod_phase("default", "full", "Succeeded")
    seen = poll(r, lambda m: all(k[0] != "full" for fam in m.values() for k in fam), "no series of the ended pod")
    assert seen["gpushare_container_memory_limit_bytes"] == {i: 3 * GiB}


def test_a_hostile_usage_file_changes_only_its_own_figures(r: Running) -> None:
    from tests.shim.test_usage_file import usage_bytes

    _, good = admit(r, "good", mem=2, core=50)
    _, bad = admit(r, "bad", mem=2, core=50)
    gpu_good = good.envs[contract.ENV_NVIDIA_VISIBLE_DEVICES]  # type: ignore[attr-defined]
    gpu_bad = bad.envs[contract.ENV_NVIDIA_VISIBLE_DEVICES]  # type: ignore[attr-defined]
    g, b = ("good", gpu_good), ("bad", gpu_bad)

    def cache(allocated: object) -> Path:
        mounts = {m.container_path: m.host_path for m in allocated.mounts}  # type: ignore[attr-defined]
        return Path(mounts[contract.CONTAINER_SHARED_CACHE])

    cache(good).write_bytes(bytes(usage_bytes(uuid=gpu_good, used=(GiB,), refused=2)))
    gpu_memory = next(x.memory_bytes for x in r.nd.node.gpus if x.uuid == gpu_bad)  # type: ignore[union-attr]
    attacks = {
        "garbage": lambda p: p.write_bytes(os.urandom(70000)),
        "huge": lambda p: p.write_bytes(bytes(usage_bytes(uuid=gpu_bad, used=((1 << 64) - 1,) * 4,
                                                          refused=(1 << 64) - 1, nslots=1 << 31))),
        "symlink to a neighbour": lambda p: p.symlink_to(cache(good)),
        "fifo": lambda p: os.mkfifo(p),
    }
    for name, attack in attacks.items():
        path = cache(bad)
        if path.is_symlink() or path.exists():
            path.unlink()
        attack(path)
        seen = scrape(r)
        assert seen["gpushare_container_memory_used_bytes"][g] == GiB, name
        assert seen["gpushare_container_memory_refusals_total"][g] == 2, name
        assert seen["gpushare_container_memory_limit_bytes"][b] == 2 * GiB, name
        used = seen["gpushare_container_memory_used_bytes"][b]
        if name == "huge":
            assert used == gpu_memory, used
            assert seen["gpushare_container_memory_refusals_total"][b] == 2 ** 53
        else:
            assert used == 0 and seen["gpushare_container_memory_refusals_total"][b] == 0, name
            assert seen["gpushare_container_usage_unreadable"][b] == 1, name
        with urllib.request.urlopen(r.http_url + "/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(r.http_url + "/readyz", timeout=5) as resp:
            assert resp.status == 200


def test_the_exposition_parses_back_whatever_the_labels_hold() -> None:
    from devplugin.app.usage_metrics import families, render
    from devplugin.isolation.container_usage import ContainerGpuUse

    odd = 'a "quoted"\\ back\nslash'
    rows = [ContainerGpuUse(namespace="ns", pod=odd, container="c", gpu=3, uuid="GPU-x", memory_limit=2 * GiB,
                            compute_share=30, memory_used=GiB, compute_used=None, refused=7, throttled_s=1.25,
                            processes=2, error=f"cannot open usage.cache: {odd}")]
    parsed = {s.name: s for fam in text_string_to_metric_families(render("n1", rows).decode()) for s in fam.samples}
    assert {f.name for f in text_string_to_metric_families(render("n1", []).decode())} == {
        name.removesuffix("_total") for name in families()}
    assert parsed["gpushare_container_memory_used_bytes"].labels == {
        "node": "n1", "namespace": "ns", "pod": odd, "container": "c", "gpu": "3", "uuid": "GPU-x"}
    assert parsed["gpushare_container_memory_refusals_total"].value == 7
    assert parsed["gpushare_container_throttled_seconds_total"].value == 1.25
    assert "gpushare_container_compute_used_percent" not in parsed  # not measured: no sample
    assert parsed["gpushare_container_usage_unreadable"].labels["reason"].endswith(odd)
