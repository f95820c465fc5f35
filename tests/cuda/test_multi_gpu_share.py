"""A container granted a share of two GPUs (pod label `aliyun.com/gpu-count: "2"`): NVIDIA's CUDA runtime (static
and shared cudart) and CuPy start under the shim, see both GPUs, each at its own slice, and what is allocated on
one GPU is charged to that GPU alone. The node has four A100s; the container sees two of them (GPUs 1 and 2 of the
node, its CUDA devices 0 and 1), at 2 GiB and 3 GiB, with its limits given as the daemon's limits file (by UUID)
or as HAMi-core's env names (by CUDA ordinal)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from devplugin import contract
from devplugin_sim.fake_driver import CONFIG_ENV
from tests.support.cuda_runtime import REPO, GiB, MiB, a100_node, run, runtime_probe, start, until
from tests.support.shim_probe import Node

GRANTED = (1, 2)  # the node's GPUs the container is granted, in the order it sees them
SLICES = (2 * GiB, 3 * GiB)  # the container's memory on its CUDA devices 0 and 1
SHARES = (30, 50)  # and its compute share of each, held (policy force)
CUPY_PROBE = REPO / "tests" / "cuda" / "cupy_devices_probe.py"


@pytest.fixture
def node(tmp_path) -> Node:
    return a100_node(tmp_path, gpus=4)


@pytest.fixture(params=["limits-file", "env"])
def share(request, node) -> dict[str, str]:
    """Env of a process of the container: its view of the node (two GPUs) and its limits on both."""
    granted = [node.uuid(i) for i in GRANTED]
    view = node.driver.write_container_config(node.dir / "container.conf", granted, driver_socket=None)
    if request.param == "limits-file":
        limits = contract.Limits(core_policy="force", devices=tuple(
            contract.DeviceLimit(uuid=uuid, memory_limit=size, sm_limit=sm)
            for uuid, size, sm in zip(granted, SLICES, SHARES, strict=True)))
        settings = {contract.ENV_LIMITS_FILE: str(node.write_limits(limits))}
    else:
        settings = {"GPU_CORE_UTILIZATION_POLICY": "force"}
        for i, (size, sm) in enumerate(zip(SLICES, SHARES, strict=True)):
            settings |= {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{size >> 20}m", f"CUDA_DEVICE_SM_LIMIT_{i}": str(sm)}
    return node.env(**settings, **{CONFIG_ENV: str(view)})


@pytest.fixture(params=["static", "shared"])
def probe(request):
    return runtime_probe(request.param)


def test_the_runtime_starts_and_sees_each_gpu_at_its_own_slice(probe, share):
    r = run(probe, share, "init", "count", "meminfo", "props", "device", 1, "meminfo", "props", "nvml")
    assert r.step("init")["error"] == "cudaSuccess", r.stderr[-2000:]
    assert r.step("count")["count"] == 2
    for i, size in enumerate(SLICES):
        assert (r.step("meminfo", i)["free"], r.step("meminfo", i)["total"]) == (size, size)
        assert r.step("props", i)["total"] == size
    assert (r.step("nvml")["total"], r.step("nvml")["free"]) == (SLICES[1], SLICES[1])  # NVML agrees on GPU 1


def test_allocations_on_the_second_gpu_are_charged_to_it_alone(node, probe, share):
    # 512 MiB allocated and a kernel image of 64 MiB loaded as a library, both with device 1 current
    proc = start(probe, share, "init", "device", 1, "alloc", 512, "library", 64, "meminfo", "nvml", "device", 0,
                 "meminfo", "nvml", "ready")
    held = 576 * MiB
    try:
        steps = until(proc, "ready")
        assert all(s["error"] == "cudaSuccess" for s in steps), steps
        on_1, nvml_1, on_0, nvml_0 = (s for s in steps if s["op"] in ("meminfo", "nvml"))
        assert (on_1["free"], on_1["total"]) == (SLICES[1] - held, SLICES[1])
        assert (nvml_1["free"], nvml_1["used"]) == (on_1["free"], held)
        assert (on_0["free"], nvml_0["free"], nvml_0["used"]) == (SLICES[0], SLICES[0], 0)
        # and the node's GPU behind the container's device 1 is the one that holds it
        assert node.driver.memory_used(GRANTED[1]) == held
        assert node.driver.memory_used(GRANTED[0]) == 0
    finally:
        proc.communicate("\n", timeout=30)


def test_allocations_on_each_gpu_stop_at_its_own_slice(probe, share):
    r = run(probe, share, "init", "device", 1, "fill", 256, "device", 0, "fill", 256, "meminfo")
    assert [r.step("fill", i)["count"] for i in range(2)] == [size // (256 * MiB) for size in reversed(SLICES)]
    assert all(r.step("fill", i)["error"] == "cudaErrorMemoryAllocation" for i in range(2))
    assert r.step("meminfo")["free"] == 0  # device 0 is full; device 1's 3 GiB did not count against it


def test_the_compute_share_of_the_second_gpu_holds_there(node, share):
    # a <<<>>> loop on device 1: the node's GPU behind it runs it at device 1's share, the other one not at all
    env = share | {"GPUSHARE_GPU_LOCK_DIR": str(node.dir), "FAKE_CUDA_NS_PER_BLOCK": "1000",
                   "FAKE_CUDA_QUEUE_US": "20000"}
    proc = start(runtime_probe("static"), env, "init", "device", 1, "launchfor", 3500, 1000)
    try:
        time.sleep(1.5)
        before, t0 = busy_ns(node, GRANTED[1], proc.pid), time.monotonic()
        time.sleep(1.5)
        used = 100.0 * (busy_ns(node, GRANTED[1], proc.pid) - before) / ((time.monotonic() - t0) * 1e9)
        idle = busy_ns(node, GRANTED[0], proc.pid)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "NVML pid" not in err, err  # the process was told apart on the second GPU too
    assert abs(used - SHARES[1]) <= 5, used
    assert idle == 0


def busy_ns(node: Node, gpu: int, pid: int) -> int:
    """GPU time the node's GPU `gpu` has run for this process's kernels."""
    return sum(t.busy_ns for t in node.driver.process_times(gpu) if t.pid == pid)


def cupy_run(env: dict[str, str], *steps: str | int) -> dict[str, list[dict]]:
    pytest.importorskip("cupy", reason="cupy-cuda13x is installed by the test extra (make all)")
    proc = subprocess.run([sys.executable, str(CUPY_PROBE), *map(str, steps)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_op: dict[str, list[dict]] = {}
    for step in map(json.loads, proc.stdout.splitlines()):
        by_op.setdefault(step["op"], []).append(step)
    return by_op


def test_cupy_sees_each_gpu_at_its_own_slice_and_charges_each_its_own(share):
    r = cupy_run(share, "devices", "alloc", 1, 512, "devices", "fill", 0, 256)
    before, after = r["devices"]
    assert before["count"] == 2
    assert [(d["free"], d["total"], d["total_global"]) for d in before["devices"]] == [(s, s, s) for s in SLICES]
    assert [d["pci_bus"] for d in before["devices"]] == [0x0F, 0x47]  # the node's GPUs 1 and 2
    assert r["alloc"][0]["device"] == 1
    assert [d["free"] for d in after["devices"]] == [SLICES[0], SLICES[1] - 512 * MiB]
    assert (r["fill"][0]["count"], r["fill"][0]["error"]) == (SLICES[0] // (256 * MiB), "OutOfMemoryError")
