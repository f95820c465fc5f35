"""CuPy (cupy-cuda13x, NVIDIA's runtime and NVRTC from PyPI) over the fake driver, with the shim, at a 2 GiB slice
of a 40 GiB GPU: what a CuPy user relies on (tests/cuda/cupy_probe.py does the CuPy side)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.cuda_runtime import REPO, GiB, MiB, a100_node, until

PROBE = REPO / "tests" / "cuda" / "cupy_probe.py"
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "2g"}

pytest.importorskip("cupy", reason="cupy-cuda13x is installed by the test extra (make all)")


@pytest.fixture
def node(tmp_path):
    return a100_node(tmp_path)


def cupy_run(env: dict[str, str], *steps: str | int) -> dict[str, list[dict]]:
    proc = subprocess.run([sys.executable, str(PROBE), *map(str, steps)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_op: dict[str, list[dict]] = {}
    for line in proc.stdout.splitlines():
        step = json.loads(line)
        by_op.setdefault(step["op"], []).append(step)
    return by_op


def test_cupy_sees_the_slice_and_stops_at_it_with_its_own_error(node):
    r = cupy_run(node.env(**LIMIT), "init", "meminfo", "fill", 256, "meminfo", "freeall", "meminfo", "nvml")
    assert (r["meminfo"][0]["free"], r["meminfo"][0]["total"]) == (2 * GiB, 2 * GiB)
    fill = r["fill"][0]
    assert fill["count"] == 8 and fill["error"] == "OutOfMemoryError"
    assert r["meminfo"][1]["free"] == 0
    assert r["meminfo"][2]["free"] == 2 * GiB  # free_all_blocks gives it all back
    assert (r["nvml"][0]["total"], r["nvml"][0]["free"]) == (2 * GiB, 2 * GiB)  # NVML agrees


def test_nvrtc_kernels_compile_load_and_launch_under_the_shim(node):
    r = cupy_run(node.env(**LIMIT), "init", "kernel", "meminfo")
    assert r["kernel"][0]["shape"] == [1024] and r["kernel"][0]["copied"]
    assert r["meminfo"][0]["free"] > 2 * GiB - 16 * MiB


def test_the_async_pool_stops_at_the_slice(node):
    r = cupy_run(node.env(**LIMIT), "init", "asyncfill", 256)
    assert r["fill"][0]["count"] == 8 and r["fill"][0]["error"] == "OutOfMemoryError"


def test_a_second_process_of_the_container_sees_the_first_ones_use(node):
    env = node.env(**LIMIT)
    first = subprocess.Popen([sys.executable, str(PROBE), "init", "fill", "512", "ready"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [json.loads(first.stdout.readline()) for _ in range(3)]
        assert lines[1]["count"] == 4
        r = cupy_run(env, "init", "meminfo", "fill", 256)
        assert r["meminfo"][0]["free"] == 0 and r["fill"][0]["count"] == 0
    finally:
        first.communicate("\n", timeout=60)


def cupy_start(env: dict[str, str], *steps: str | int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PROBE), *map(str, steps)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def busy_ns(node, pid: int) -> int:
    """GPU time the fake GPU's timeline has run for this process's kernels."""
    return sum(t.busy_ns for t in node.driver.process_times(0) if t.pid == pid)


def finish(proc: subprocess.Popen) -> None:
    try:
        _, err = proc.communicate("\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]


# A float32 GEMM goes through cublasGemmEx to cuBLASLt, which looks the driver up by name (dlsym) and asks the
# driver's private context table (21318c60) for the context's number before it picks an algorithm; at 256 x 256
# the algorithm splits K and cuBLAS first finds its workspace for the stream through two more slots of that table
# (fakes/README.md, "The context table"). The kernel is launched on the fake GPU, which runs no kernels: the values
# of the result mean nothing, so the tests hold what a user relies on besides them: the call returns, its kernel
# reaches the driver and its memory counts.
GEMM = 512
SPLIT_K_GEMM = 256
GEMM_ARRAYS = 2 * 2 * MiB  # the operand and the result of the 512 x 512 GEMM, 1 MiB each, in 2 MiB granules
LOOP_GEMM = 1024  # 640 us of GPU time each at 1 us per block: few launches per second for the share to pace


def test_a_cublas_gemm_runs_over_the_fake_driver(node):
    proc = cupy_start(node.env(shim=False, FAKE_CUDA_NS_PER_BLOCK="1000"), "init", "meminfo", "gemm", GEMM,
                      "gemm", SPLIT_K_GEMM, "meminfo", "ready")
    try:
        steps = until(proc, "ready")
        by_op: dict[str, list[dict]] = {}
        for step in steps:
            by_op.setdefault(step["op"], []).append(step)
        for gemm, n in zip(by_op["gemm"], (GEMM, SPLIT_K_GEMM), strict=True):
            assert gemm["ok"], gemm
            assert gemm["shape"] == [n, n]
        assert busy_ns(node, proc.pid) > 0  # their kernels ran on the GPU's timeline
        before, after = by_op["meminfo"]
        assert before["free"] - after["free"] >= GEMM_ARRAYS
    finally:
        finish(proc)


def test_a_cublas_gemm_under_the_shim_is_charged_to_the_slice_and_held_to_the_share(node):
    env = node.env(**LIMIT, CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="force",
                   GPUSHARE_GPU_LOCK_DIR=str(node.dir), FAKE_CUDA_NS_PER_BLOCK="1000", FAKE_CUDA_QUEUE_US="20000")
    proc = cupy_start(env, "init", "meminfo", "gemm", GEMM, "gemm", SPLIT_K_GEMM, "meminfo", "nvml", "gemmfor", 4,
                      LOOP_GEMM)
    try:
        steps = until(proc, "nvml")
        before, after = [s for s in steps if s["op"] == "meminfo"]
        nvml = steps[-1]
        for gemm in [s for s in steps if s["op"] == "gemm"]:
            assert gemm["ok"], gemm
        assert (before["free"], before["total"]) == (2 * GiB, 2 * GiB)
        assert after["total"] == 2 * GiB and before["free"] - after["free"] >= GEMM_ARRAYS
        assert (nvml["total"], nvml["free"]) == (2 * GiB, after["free"])  # NVML agrees
        # GEMMs back to back now: the shim's gate holds them to the 30 % share, measured on the GPU's timeline
        time.sleep(1.5)
        busy0, t0 = busy_ns(node, proc.pid), time.monotonic()
        time.sleep(1.5)
        share = 100.0 * (busy_ns(node, proc.pid) - busy0) / ((time.monotonic() - t0) * 1e9)
        assert abs(share - 30) <= 5, share
    finally:
        finish(proc)
