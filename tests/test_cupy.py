"""CuPy (cupy-cuda13x, NVIDIA's runtime and NVRTC from PyPI) over the fake driver, with the shim, at a 2 GiB slice
of a 40 GiB GPU: what a CuPy user relies on (tests/cuda/cupy_probe.py does the CuPy side)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cuda_runtime import REPO, GiB, MiB, a100_node

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
