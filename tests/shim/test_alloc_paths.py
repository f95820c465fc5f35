"""Every way to take device memory counts against the limit: the 32-bit cuMemAlloc, arrays and mipmapped arrays,
module globals, graph memory nodes, memory opened through IPC; stream-ordered frees give back in stream order;
an allocation the shim cannot place on a GPU never reaches the driver; entry points it does not know are
refused."""

from __future__ import annotations

import pytest

from tests.support.shim_probe import (
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    MiB,
    run,
    run_full,
    start,
    until,
)
from tests.support.shim_probe import node as node  # the fixture

CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_FOUND = 500
FLOAT = "0x20"


def used_in_view(step: dict) -> int:
    return step["total"] - step["free"]


@pytest.mark.parametrize("mode", ["gpa", "dlsym", "linked"])
def test_the_cuda_3_1_cu_mem_alloc_is_counted_and_freed(node, mode):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="64m"), "init", "ctx", 0, "fill", "alloc1", "2m", "freeall",
                "fill", "alloc1", "2m", "counters", mode=mode)
    assert [(s["bytes"], s["rc"]) for s in steps if s["op"] == "fill"] == [(64 * MiB, CUDA_ERROR_OUT_OF_MEMORY)] * 2
    assert steps[-1]["mem_oom"] == 0  # the shim refused, the driver never had to


@pytest.mark.parametrize("create,charge_mib", [
    (("array", 1024, 1024, FLOAT, 4), 16),             # 1024 x 1024 float4: 16 MiB
    (("array", 1000, 1, "0x01", 1), 2),                # 1000 bytes: one 2 MiB granule
    (("array3d", 512, 512, 1, FLOAT, 4, "0x04"), 24),  # a cube map: six faces of 4 MiB
    (("array3d", 256, 256, 16, FLOAT, 4, "0x01"), 16),  # 16 layers of 1 MiB
    (("mipmap", 1024, 1024, 0, FLOAT, 4, 11), 22),     # 16 MiB + 4 + 1 + ... = 21.3 MiB, rounded up
])
def test_arrays_are_charged_what_the_driver_takes(node, create, charge_mib):
    holder = start(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, *create, "meminfo", "ready")
    try:
        steps = until(holder, "ready")
        assert steps[2]["rc"] == CUDA_SUCCESS
        assert used_in_view(steps[3]) == charge_mib * MiB == node.driver.memory_used(0)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


def test_arrays_stop_at_the_limit_and_give_back_when_destroyed(node):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="64m")
    big = ("mipmap", 1024, 1024, 0, FLOAT, 4, 11)  # 22 MiB each
    steps = run(env, "init", "ctx", 0, *big, *big, *big, "free", *big, "array", 4096, 4096, FLOAT, 4, "counters")
    assert [s["rc"] for s in steps[2:7] if s["op"] != "free"] == [
        CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert steps[7]["rc"] == CUDA_ERROR_OUT_OF_MEMORY  # 256 MiB
    assert steps[-1]["mem_oom"] == 0


def test_module_globals_count_and_an_oversized_module_is_unloaded(node):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="64m"), "init", "ctx", 0, "module", "40m", "meminfo",
                "alloc", "32m", "module", "30m", "meminfo", "free", "alloc", "32m", "meminfo")
    assert steps[2]["rc"] == CUDA_SUCCESS and used_in_view(steps[3]) == 40 * MiB
    assert steps[4]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert steps[5]["rc"] == CUDA_ERROR_OUT_OF_MEMORY and used_in_view(steps[6]) == 40 * MiB  # unloaded again
    assert steps[8]["rc"] == CUDA_SUCCESS and used_in_view(steps[9]) == 32 * MiB


def test_graph_memory_nodes_are_charged_when_added(node):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="64m"), "init", "ctx", 0, "graphnode", "48m", "meminfo",
                "alloc", "32m", "graphnode", "100m")
    assert steps[2]["rc"] == CUDA_SUCCESS and used_in_view(steps[3]) == 48 * MiB
    assert steps[4]["rc"] == CUDA_ERROR_OUT_OF_MEMORY and steps[5]["rc"] == CUDA_ERROR_OUT_OF_MEMORY


def exported(node, size: str):
    """A process outside the container (no shim) that allocates `size` and exports it; with its IPC handle."""
    proc = start(node.env(shim=False), "init", "ctx", 0, "alloc", size, "ipcget", "ready")
    handle = until(proc, "ready")[3]["handle"]
    return proc, handle


def test_memory_opened_through_ipc_counts_against_the_importer(node):
    exporter, handle = exported(node, "512m")
    try:
        steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "ipcopen", handle, "meminfo",
                    "alloc", "768m", "free", "alloc", "768m")
    finally:
        exporter.stdin.close()
        exporter.wait(timeout=10)
    assert steps[2]["rc"] == CUDA_SUCCESS and used_in_view(steps[3]) == 512 * MiB
    assert steps[4]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert steps[6]["rc"] == CUDA_SUCCESS  # closing the handle gave the room back


def test_ipc_memory_larger_than_the_limit_is_refused_and_closed(node):
    exporter, handle = exported(node, "2g")
    try:
        steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "ipcopen", handle, "counters")
    finally:
        exporter.stdin.close()
        exporter.wait(timeout=10)
    assert steps[2]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert steps[3]["live_bytes"] == 0  # the mapping was closed again


def test_a_stream_ordered_free_gives_back_when_the_stream_gets_there(node):
    # 0.6 s of kernels are queued before the free: until they have run, the memory is still in use.
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", FAKE_CUDA_NS_PER_BLOCK=1000, FAKE_CUDA_QUEUE_US=5_000_000)
    steps = run(env, "init", "ctx", 0, "async", "512m", "launch", 1, 600_000, "free", "meminfo", "sync", "meminfo")
    assert steps[3]["rc"] == CUDA_SUCCESS and steps[4]["rc"] == CUDA_SUCCESS
    assert used_in_view(steps[5]) == 512 * MiB
    assert used_in_view(steps[7]) == 0


def test_a_stream_ordered_free_on_a_finished_stream_gives_back_at_once(node):
    # Nothing queued: the stream has finished once the free is queued, so the charge goes back without waiting.
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", FAKE_CUDA_NS_PER_BLOCK=1000)
    steps = run(env, "init", "ctx", 0, "async", "512m", "free", "meminfo")
    assert steps[2]["rc"] == CUDA_SUCCESS and steps[3]["rc"] == CUDA_SUCCESS
    assert used_in_view(steps[4]) == 0


def test_a_stream_that_finished_and_gets_more_work_holds_the_next_free_back(node):
    # The first free finds the stream done and gives back at once; then 0.6 s of kernels are queued, and the next
    # free must wait for them: a stream seen finished once is not taken as finished for good.
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", FAKE_CUDA_NS_PER_BLOCK=1000, FAKE_CUDA_QUEUE_US=5_000_000)
    steps = run(env, "init", "ctx", 0, "async", "256m", "free", "meminfo", "launch", 1, 600_000,
                "async", "512m", "free", "meminfo", "sync", "meminfo")
    assert [s["rc"] for s in (steps[2], steps[3], steps[6], steps[7])] == [CUDA_SUCCESS] * 4
    assert used_in_view(steps[4]) == 0
    assert used_in_view(steps[8]) == 512 * MiB
    assert used_in_view(steps[10]) == 0


def test_without_a_current_context_an_allocation_never_reaches_the_driver(node):
    # Two GPUs, so the shim cannot guess the device: the driver's own error comes back and nothing is allocated.
    result = run_full(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "nocontext", "alloc", "64m",
                      "async", "64m", "counters")
    assert [s["rc"] for s in result.steps[3:5]] == [CUDA_ERROR_INVALID_CONTEXT] * 2
    assert result.step("counters")["mem_alloc"] == 0 and result.step("counters")["live_bytes"] == 0


def test_an_allocation_entry_point_the_shim_does_not_know_is_refused(node):
    # A newer driver's cuMemAlloc (asked for CUDA 13.1, past what the shim knows, at an address of its own): the
    # shim cannot tell what it takes, so the lookup fails rather than let memory escape the limit.
    steps = ("init", "lookup", "cuMemAlloc", 13010, "lookup", "cuMemAllocPitch", 2000, "lookup", "cuMemAlloc",
             2000, "lookup", "cuCtxSynchronize", 12080)
    newer = {"FAKE_CUDA_DISTINCT_ENTRY_POINTS": "1"}
    without = run(node.env(shim=False, **newer), *steps)
    assert [s["found"] for s in without[1:]] == [True, True, True, True]
    result = run_full(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", **newer), *steps)
    unknown, old_pitch, old_alloc, other = result.steps[1:]
    assert (unknown["rc"], unknown["found"]) == (CUDA_ERROR_NOT_FOUND, False)
    assert old_pitch["found"] and old_alloc["found"] and other["found"]  # hooked versions, other entry points
    assert "cuGetProcAddress(cuMemAlloc, version 13010)" in result.stderr


@pytest.mark.parametrize("mode", ["linked", "gpa", "dlsym"])
def test_the_cuda_3_1_cu_mem_alloc_pitch_is_capped_and_reported(node, mode):
    """A program linked to libcuda that declares the CUDA 3.1 cuMemAllocPitch reaches it without any lookup: it is
    charged like the current one, stops at the limit, and the use is reported."""
    holder = start(node.env(CUDA_DEVICE_MEMORY_LIMIT="64m"), "init", "ctx", 0, "pitch1", 1000, 16384,
                   "meminfo", "pitch1", 1000, 16384, "pitch1", 1000, 16384, "pitch1", 1000, 16384,
                   "pitch1", 1000, 16384, "meminfo", "counters", "ready", mode=mode)
    try:
        steps = until(holder, "ready")
        pitched = [s for s in steps if s["op"] == "pitch1"]
        assert all(s["pitch"] == 1024 for s in pitched if s["rc"] == CUDA_SUCCESS)
        # 16 MiB each: three fit under 64 MiB with the context's charge, the fourth and fifth are refused
        assert [s["rc"] for s in pitched][:3] == [CUDA_SUCCESS] * 3
        assert CUDA_ERROR_OUT_OF_MEMORY in [s["rc"] for s in pitched]
        granted = sum(s["bytes"] for s in pitched if s["rc"] == CUDA_SUCCESS)
        first, last = [s for s in steps if s["op"] == "meminfo"]
        assert used_in_view(last) <= 64 * MiB
        assert used_in_view(last) - used_in_view(first) == granted - 16 * MiB  # the shim's view counts them
        assert node.driver.memory_used(0) <= 64 * MiB
        assert steps[-2]["mem_oom"] == 0  # the shim refused; the driver was never asked past the limit
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


def test_allocations_the_driver_refuses_leave_no_charge(node):
    # The GPU is full of another tenant's memory: the driver refuses, and the container's charge rolls back.
    other = start(node.env(shim=False), "init", "ctx", 0, "alloc", "15g", "ready")
    try:
        until(other, "ready")
        steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="4g"), "init", "ctx", 0, "array", 16384, 16384, FLOAT, 4,
                    "module", "2g", "alloc1", "2g", "nvml", 0)
    finally:
        other.stdin.close()
        other.wait(timeout=10)
    assert [s["rc"] for s in steps[2:5]] == [CUDA_ERROR_OUT_OF_MEMORY] * 3
    assert steps[5]["used"] == 0


@pytest.mark.parametrize("mode", ["gpa", "gpa-ptsz"])
def test_entry_points_at_other_addresses_than_the_exported_symbols_are_matched_by_name(node, mode):
    # The driver answers cuGetProcAddress with its own entry points, not the exported symbols' addresses.
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", FAKE_CUDA_DISTINCT_ENTRY_POINTS=1)
    result = run_full(env, "init", "ctx", 0, "fill", "alloc", "256m", "freeall", "fill", "async", "256m", "freeall",
                      "sync", "fill", "alloc", "256m", "lookup", "cuMemAlloc", 13050, mode=mode)
    assert [s["bytes"] for s in result.steps if s["op"] == "fill"] == [1 << 30] * 3
    # A newer CUDA version than the shim knows may mean another signature: only an exact match is trusted.
    assert result.step("lookup")["found"] is False
    assert "cuGetProcAddress(cuMemAlloc, version 13050)" in result.stderr


def test_a_free_captured_into_a_graph_keeps_its_charge(node):
    # While a stream is captured, cuMemFreeAsync is recorded into the graph, not done: the graph's memory stays
    # reserved for the graph, and the charge stays with it.
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", FAKE_CUDA_CAPTURING=1)
    steps = run(env, "init", "ctx", 0, "async", "512m", "free", "sync", "meminfo", "alloc", "768m")
    assert used_in_view(steps[5]) == 512 * MiB and steps[6]["rc"] == CUDA_ERROR_OUT_OF_MEMORY


@pytest.mark.parametrize("mode", ["linked", "gpa", "dlsym"])
@pytest.mark.parametrize("create", [("array1", 1024, 1024, FLOAT, 4), ("array3d1", 256, 256, 16, FLOAT, 4, "0x01")])
def test_the_cuda_3_1_array_entry_points_are_capped_and_reported(node, mode, create):
    """The CUDA 3.1 cuArrayCreate / cuArray3DCreate (32-bit descriptors), reachable by a linked program: 16 MiB each,
    charged what the driver takes; the fifth of 16 MiB does not fit under 64 MiB."""
    holder = start(node.env(CUDA_DEVICE_MEMORY_LIMIT="64m"), "init", "ctx", 0, "meminfo", *create * 5, "meminfo",
                   "counters", "ready", mode=mode)
    try:
        steps = until(holder, "ready")
        made = [s["rc"] for s in steps if s["op"] == create[0]]
        assert made[:3] == [CUDA_SUCCESS] * 3 and CUDA_ERROR_OUT_OF_MEMORY in made
        first, last = [s for s in steps if s["op"] == "meminfo"]
        assert used_in_view(last) - used_in_view(first) == 16 * MiB * made.count(CUDA_SUCCESS)
        assert node.driver.memory_used(0) <= 64 * MiB
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
