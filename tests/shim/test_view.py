"""The virtual view: cuMemGetInfo, cuDeviceTotalMem and NVML (what nvidia-smi and pynvml read) show the slice."""

from __future__ import annotations

import subprocess
import sys

from devplugin import contract
from tests.support.shim_probe import CUDA_SUCCESS, GiB, MiB, make_node, run, start, until
from tests.support.shim_probe import node as node  # the fixture


def test_cuda_shows_the_slice_and_what_is_used_of_it(node):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="2g"), "init", "ctx", 0,
                "meminfo", "alloc", "512m", "meminfo", "totalmem", 0, "totalmem", 1)
    assert steps[2] == {"op": "meminfo", "rc": 0, "free": 2 * GiB, "total": 2 * GiB}
    assert steps[4] == {"op": "meminfo", "rc": 0, "free": 1536 * MiB, "total": 2 * GiB}
    assert steps[5]["total"] == 2 * GiB and steps[6]["total"] == 2 * GiB


def test_a_limit_above_the_gpu_shows_the_gpu(tmp_path):
    node = make_node(tmp_path, n=1, memory_mib=4096)
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="64g"), "init", "ctx", 0, "meminfo", "totalmem", 0)
    assert steps[2]["total"] == 4 * GiB and steps[3]["total"] == 4 * GiB


def test_free_is_never_above_what_the_gpu_really_has(node):
    # Another tenant (no shim) takes 15 GiB of the 16 GiB GPU; the container's 2 GiB slice has 1 GiB free.
    other = start(node.env(shim=False), "init", "ctx", 0, "alloc", "15g", "ready")
    try:
        until(other, "ready")
        steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="2g"), "init", "ctx", 0, "meminfo")
        assert steps[2]["total"] == 2 * GiB and steps[2]["free"] == 1 * GiB
    finally:
        other.stdin.close()
        other.wait(timeout=10)


def test_nvml_shows_the_slice_to_other_processes_of_the_container(node):
    limits = contract.Limits(devices=(contract.DeviceLimit(node.uuid(0), 2 * GiB, 100),
                                      contract.DeviceLimit(node.uuid(1), 3 * GiB, 100)))
    env = node.env(GPUSHARE_LIMITS_FILE=node.write_limits(limits))
    holder = start(env, "init", "ctx", 0, "alloc", "512m", "ready")
    try:
        until(holder, "ready")
        first, second = run(env, "nvml", 0, "nvml", 1)  # an NVML-only process, like nvidia-smi
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    assert (first["rc"], first["total"], first["used"], first["free"]) == (0, 2 * GiB, 512 * MiB, 1536 * MiB)
    assert (first["rc_v2"], first["total_v2"], first["used_v2"], first["free_v2"], first["reserved_v2"]) == (
        0, 2 * GiB, 512 * MiB, 1536 * MiB, 0)
    assert (second["total"], second["used"], second["free"]) == (3 * GiB, 0, 3 * GiB)


def test_nvml_without_a_limit_is_the_driver_s_answer(node):
    with_shim = run(node.env(), "nvml", 0)[0]
    without = run(node.env(shim=False), "nvml", 0)[0]
    assert with_shim == without and without["total"] == 16 * GiB


def test_pynvml_in_a_shimmed_python_sees_the_slice(node):
    code = (
        "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "m = pynvml.nvmlDeviceGetMemoryInfo(h); print(m.total, m.used, m.free); pynvml.nvmlShutdown()"
    )
    out = subprocess.run([sys.executable, "-c", code], env=node.env(CUDA_DEVICE_MEMORY_LIMIT_0="3g"),
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(3 * GiB), "0", str(3 * GiB)]


def test_an_unknown_cuda_call_result_is_passed_on(node):
    # Without a current context the driver's own error comes back, not one made up by the shim.
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="2g"), "init", "meminfo")
    assert steps[1]["rc"] != CUDA_SUCCESS and steps[1]["rc"] == run(node.env(shim=False), "init", "meminfo")[1]["rc"]
