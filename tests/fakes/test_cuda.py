"""The fake libcuda.so.1 the shim's tests stand on: GPUs from the fake NVML's config, memory shared with NVML
through the state file, cuGetProcAddress with versions and per-thread-stream variants, simulated kernels."""

from __future__ import annotations

import time

import pytest

from tests.support.shim_probe import CUDA_ERROR_OUT_OF_MEMORY, GiB, MiB, make_node, run, start, until


@pytest.fixture
def node(tmp_path):
    return make_node(tmp_path, n=2, memory_mib=4096)


def test_the_gpus_and_their_memory_come_from_the_nvml_config(node):
    steps = run(node.env(shim=False), "init", "ctx", 1, "meminfo", "totalmem", 0, "fill", "alloc", "512m")
    assert steps[0]["devices"] == 2
    assert steps[2] == {"op": "meminfo", "rc": 0, "free": 4 * GiB, "total": 4 * GiB}
    assert steps[3]["total"] == 4 * GiB
    assert steps[4]["bytes"] == 4 * GiB and steps[4]["rc"] == CUDA_ERROR_OUT_OF_MEMORY


def test_memory_is_shared_by_processes_and_seen_by_nvml(node):
    holder = start(node.env(shim=False), "init", "ctx", 0, "alloc", "1g", "ready")
    try:
        until(holder, "ready")
        assert node.driver.memory_used(0) == GiB
        steps = run(node.env(shim=False), "init", "ctx", 0, "meminfo", "nvml", 0)
        assert steps[2]["free"] == 3 * GiB
        assert (steps[3]["used"], steps[3]["free"]) == (GiB, 3 * GiB)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    assert node.driver.memory_used(0) == 0  # a process that ends gives its memory back


def test_a_context_takes_memory_when_asked_to(node):
    steps = run(node.env(shim=False, FAKE_CUDA_CONTEXT_MIB=300), "init", "ctx", 0, "meminfo")
    assert steps[2]["free"] == 4 * GiB - 300 * MiB


def test_cuda_visible_devices_picks_and_orders_gpus_by_index_or_uuid(node):
    by_uuid = run(node.env(shim=False, CUDA_VISIBLE_DEVICES=node.uuid(1)), "init", "ctx", 0, "alloc", "1g")
    assert by_uuid[0]["devices"] == 1 and node.driver.memory_used(1) == 0  # the process has ended
    holder = start(node.env(shim=False, CUDA_VISIBLE_DEVICES="1,0"), "init", "ctx", 0, "alloc", "1g", "ready")
    try:
        assert until(holder, "ready")[0]["devices"] == 2
        assert (node.driver.memory_used(0), node.driver.memory_used(1)) == (0, GiB)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


@pytest.mark.parametrize("mode,suffix", [("gpa", ""), ("gpa-ptsz", "_ptsz"), ("dlsym", ""), ("linked", "")])
def test_each_door_reaches_the_matching_entry_point(node, mode, suffix):
    steps = run(node.env(shim=False), "init", "ctx", 0, "launch", 3, 1, "launchex", 2, 1, "coop", 1, 1,
                "graph", 4, 1, "async", "1m", "free", "counters", mode=mode)
    counters = steps[-1]
    expected = {"launch": 3, "launch_ex": 2, "launch_coop": 1, "graph_launch": 4, "mem_alloc_async": 1,
                "mem_free_async": 1}
    other = "_ptsz" if not suffix else ""
    for name, n in expected.items():
        assert counters[name + suffix] == n and counters[name + other] == 0, name


def test_simulated_kernels_show_as_utilisation(node):
    env = node.env(shim=False, FAKE_CUDA_NS_PER_BLOCK=1000, FAKE_CUDA_QUEUE_US=20000)
    holder = start(env, "init", "ctx", 0, "launchfor", "launch", 600, 100, "ready")
    try:
        until(holder, "ready")
        assert node.driver.utilization(0) >= 80
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    deadline = time.monotonic() + 2  # it ended: the GPU's next utilisation sample shows it idle
    while node.driver.utilization(0) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.driver.utilization(0) == 0
