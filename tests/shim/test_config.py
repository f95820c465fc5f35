"""Where the shim's limits come from: the daemon's limits file wins over env, GPUs are matched by UUID, and a
limit that cannot be read refuses CUDA with a message instead of running unlimited."""

from __future__ import annotations

import subprocess

import pytest

from devplugin import contract
from tests.support.shim_probe import (
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    SHIM,
    GiB,
    run,
    run_full,
)
from tests.support.shim_probe import node as node  # the fixture


def limits_for(node, *per_gpu: tuple[int, int, int], policy: str = "default") -> contract.Limits:
    """(fake GPU index, memory limit, sm limit) per container device."""
    return contract.Limits(
        devices=tuple(contract.DeviceLimit(node.uuid(i), mem, sm) for i, mem, sm in per_gpu), core_policy=policy)


def test_the_limits_file_wins_over_a_conflicting_env_var(node):
    path = node.write_limits(limits_for(node, (0, 1 * GiB, 100), (1, 1 * GiB, 100)))
    env = node.env(GPUSHARE_LIMITS_FILE=path, CUDA_DEVICE_MEMORY_LIMIT="8g", CUDA_DEVICE_MEMORY_LIMIT_0="8g",
                   CUDA_DEVICE_SM_LIMIT=100, GPU_CORE_UTILIZATION_POLICY="disable")
    steps = run(env, "init", "ctx", 0, "fill", "alloc", "128m")
    assert steps[2]["bytes"] == GiB


def test_the_file_s_compute_share_and_policy_win_too(node):
    path = node.write_limits(limits_for(node, (0, 0, 40), (1, 0, 100), policy="force"))
    steps = run(node.env(GPUSHARE_LIMITS_FILE=path, CUDA_DEVICE_SM_LIMIT=100, GPU_CORE_UTILIZATION_POLICY="disable"),
                "init", "stats", 0, "stats", 1)
    assert (steps[1]["active"], steps[1]["sm_limit"]) == (1, 40)
    assert (steps[2]["active"], steps[2]["sm_limit"]) == (0, 100)


def test_devices_are_matched_by_uuid_not_by_position(node):
    # The container's device 0 is the node's GPU 1; CUDA numbers the GPUs in the opposite order.
    path = node.write_limits(limits_for(node, (1, 1 * GiB, 100), (0, 2 * GiB, 100)))
    env = node.env(GPUSHARE_LIMITS_FILE=path, CUDA_VISIBLE_DEVICES=f"{node.uuid(1)},{node.uuid(0)}")
    steps = run(env, "init", "ctx", 0, "fill", "alloc", "128m", "ctx", 1, "fill", "alloc", "128m")
    assert steps[2]["bytes"] == 1 * GiB and steps[4]["bytes"] == 2 * GiB
    env = node.env(GPUSHARE_LIMITS_FILE=path, CUDA_VISIBLE_DEVICES="0,1")
    steps = run(env, "init", "ctx", 0, "fill", "alloc", "128m", "ctx", 1, "fill", "alloc", "128m")
    assert steps[2]["bytes"] == 2 * GiB and steps[4]["bytes"] == 1 * GiB


def test_a_gpu_the_limits_file_does_not_list_may_not_be_used(node):
    path = node.write_limits(limits_for(node, (0, 1 * GiB, 100)))
    result = run_full(node.env(GPUSHARE_LIMITS_FILE=path), "init", "ctx", 1, "alloc", "1m", "ctx", 0, "alloc", "1m")
    rcs = [s["rc"] for s in result.steps]
    assert rcs[:2] == [CUDA_SUCCESS, CUDA_ERROR_NOT_PERMITTED] and rcs[2] != CUDA_SUCCESS  # no context on GPU 1
    assert rcs[3:] == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert f"CUDA device 1 ({node.uuid(1)}) is not in the limits file" in result.stderr


def test_env_limits_per_device_and_for_all(node):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="3g", CUDA_DEVICE_MEMORY_LIMIT_1="1g")
    steps = run(env, "init", "ctx", 0, "fill", "alloc", "128m", "ctx", 1, "fill", "alloc", "128m")
    assert steps[2]["bytes"] == 3 * GiB and steps[4]["bytes"] == 1 * GiB


@pytest.mark.parametrize("value,bytes_", [("1073741824", GiB), ("1048576k", GiB), ("1024M", GiB), ("1g", GiB)])
def test_env_sizes(node, value, bytes_):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT=value), "init", "ctx", 0, "meminfo")
    assert steps[2]["total"] == bytes_


@pytest.mark.parametrize("name,value", [
    ("CUDA_DEVICE_MEMORY_LIMIT", "2Gi"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "-1"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "1.5g"),
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "two gigabytes"),
    ("CUDA_DEVICE_MEMORY_LIMIT", "99999999999999999999g"),
    ("CUDA_DEVICE_SM_LIMIT", "150"),
    ("CUDA_DEVICE_SM_LIMIT_1", "half"),
    ("GPUSHARE_CONTEXT_RESERVE", "lots"),
])
def test_a_bad_env_limit_refuses_cuda_with_a_message(node, name, value):
    result = run_full(node.env(**{name: value}), "init", "ctx", 0, "alloc", "1m")
    assert [s["rc"] for s in result.steps] == [CUDA_ERROR_NOT_PERMITTED] * 3
    assert "[gpushare]" in result.stderr and f"{name}={value}" in result.stderr


def test_a_bad_policy_is_reported_and_the_default_kept(node):
    result = run_full(node.env(CUDA_DEVICE_SM_LIMIT=50, GPU_CORE_UTILIZATION_POLICY="sometimes"), "init", "stats", 0)
    assert result.steps[0]["rc"] == CUDA_SUCCESS and result.steps[1]["active"] == 1
    assert "GPU_CORE_UTILIZATION_POLICY=sometimes" in result.stderr


@pytest.mark.parametrize("text,why", [
    ("version=1\ndevices=1\ndevice.0.uuid=GPU-x\n", "device.0.memory_limit"),
    ("version=2\ndevices=1\ndevice.0.uuid=GPU-x\ndevice.0.memory_limit=1\n", "version"),
    ("garbage\n", "line 1"),
])
def test_a_broken_limits_file_refuses_cuda_and_names_the_file(node, text, why):
    path = node.dir / "limits"
    path.write_text(text)
    result = run_full(node.env(GPUSHARE_LIMITS_FILE=path, CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "alloc", "1m")
    assert [s["rc"] for s in result.steps] == [CUDA_ERROR_NOT_PERMITTED] * 2
    assert str(path) in result.stderr and why in result.stderr


def test_a_limits_file_that_is_named_but_missing_refuses_cuda(node):
    result = run_full(node.env(GPUSHARE_LIMITS_FILE=node.dir / "nowhere"), "init")
    assert result.steps[0]["rc"] == CUDA_ERROR_NOT_PERMITTED and "nowhere" in result.stderr


def test_nvml_is_refused_too_when_limits_cannot_be_read(node):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="lots"), "nvml", 0)
    assert steps[0]["rc"] == 4  # NVML_ERROR_NO_PERMISSION


def test_log_level_controls_the_messages_but_errors_always_show(node):
    quiet = run_full(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "alloc", "2g")
    chatty = run_full(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", LIBCUDA_LOG_LEVEL=3), "init", "ctx", 0, "alloc", "2g")
    assert quiet.stderr == "" and quiet.steps[2]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert "[gpushare] info" in chatty.stderr and "out of memory on CUDA device 0" in chatty.stderr
    silent = run_full(node.env(CUDA_DEVICE_MEMORY_LIMIT="2Gi", LIBCUDA_LOG_LEVEL=0), "init")
    assert "[gpushare] error" in silent.stderr and "CUDA_DEVICE_MEMORY_LIMIT=2Gi" in silent.stderr


def test_processes_that_never_use_cuda_are_untouched_even_with_bad_settings(node):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="2Gi", GPUSHARE_LIMITS_FILE=node.dir / "nowhere")
    for argv in (["/bin/sh", "-c", "echo hello"], ["python3", "-c", "print('hello')"]):
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        assert (out.returncode, out.stdout, out.stderr) == (0, "hello\n", "")
    assert env["LD_PRELOAD"] == str(SHIM)
