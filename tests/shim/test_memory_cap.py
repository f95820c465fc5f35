"""The shim's memory cap: out of memory exactly at the limit, frees give room back, every allocation path."""

from __future__ import annotations

import pytest

from tests.support.shim_probe import (
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    GiB,
    MiB,
    make_node,
    run,
    run_full,
    start,
    until,
)
from tests.support.shim_probe import node as node  # the fixture

MODES = ["gpa", "gpa-ptsz", "dlsym", "linked"]
DEVICE_KINDS = ["alloc", "managed", "async", "pool", "create"]


@pytest.mark.parametrize("mode", MODES)
def test_out_of_memory_exactly_at_the_limit_and_not_before(node, mode):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1000m")
    steps = run(env, "init", "ctx", 0, "alloc", "998m", "alloc", "2m", "alloc", 1, "meminfo", mode=mode)
    assert [s["rc"] for s in steps[2:5]] == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
    assert steps[5]["free"] == 0 and steps[5]["total"] == 1000 * MiB


@pytest.mark.parametrize("kind", DEVICE_KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_every_device_allocation_kind_stops_at_the_limit(node, mode, kind):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "fill", kind, "64m", mode=mode)
    fill = steps[-1]
    assert fill["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert fill["bytes"] == GiB and fill["count"] == 16


def test_pitched_allocations_count_their_padded_rows(node):
    # 1000-byte rows are padded to 1024 by the (fake) driver: 2048 rows take 2 MiB, one granule.
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="6m"), "init", "ctx", 0,
                "pitch", 1000, 2048, "pitch", 1000, 2048, "meminfo", "pitch", 1000, 2048, "pitch", 1000, 2048)
    assert [s["rc"] for s in steps if s["op"] == "pitch"] == [0, 0, 0, CUDA_ERROR_OUT_OF_MEMORY]
    assert steps[4]["free"] == 2 * MiB


@pytest.mark.parametrize("mode", MODES)
def test_small_allocations_are_charged_what_the_driver_reserves(node, mode):
    # The driver takes device memory in 2 MiB granules: a 1-byte allocation holds 2 MiB of the GPU. Charging
    # the requested bytes would let a container hold far more than its limit; charging granules matches the
    # driver, which here is exactly the size of the limit and never has to refuse.
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="6m"), "init", "ctx", 0,
                "alloc", 1, "alloc", 1, "pitch", 1000, 1, "meminfo", "alloc", 1, "counters", mode=mode)
    assert [s["rc"] for s in steps[2:5]] == [CUDA_SUCCESS] * 3
    assert steps[5]["free"] == 0
    assert steps[6]["rc"] == CUDA_ERROR_OUT_OF_MEMORY and steps[7]["mem_oom"] == 0
    assert node.driver.memory_used(0) == 0  # and the process gave it all back when it ended


def test_async_allocation_over_the_limit_is_out_of_memory_on_both_stream_kinds(node):
    for mode, counter in (("gpa", "mem_alloc_async"), ("gpa-ptsz", "mem_alloc_async_ptsz")):
        steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "async", "768m", "async", "512m",
                    "counters", mode=mode)
        assert [steps[2]["rc"], steps[3]["rc"]] == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
        assert steps[4][counter] == 1  # the refused one never reached the driver


@pytest.mark.parametrize("mode", ["gpa", "linked"])
def test_frees_give_the_room_back(node, mode):
    # Stream-ordered frees give the room back once the stream has done them: after a synchronisation.
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0,
                "fill", "alloc", "128m", "free", "alloc", "128m", "alloc", "128m",
                "freeall", "fill", "async", "256m", "freeall", "sync", "fill", "create", "512m", mode=mode)
    fills = [s for s in steps if s["op"] == "fill"]
    assert [f["bytes"] for f in fills] == [GiB, GiB, GiB]
    allocs = [s["rc"] for s in steps if s["op"] == "alloc"]
    assert allocs == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]


def test_host_memory_is_not_counted(node):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0,
                "createhost", "4g", "hostpool", "4g", "fill", "alloc", "256m")
    assert steps[2]["rc"] == CUDA_SUCCESS and steps[3]["rc"] == CUDA_SUCCESS
    assert steps[4]["bytes"] == GiB


def test_the_context_is_charged_once_per_process(node):
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", GPUSHARE_CONTEXT_RESERVE="256m"),
                "init", "ctx", 0, "meminfo", "ctx", 0, "fill", "alloc", "64m")
    assert steps[2]["free"] == 768 * MiB
    assert steps[4]["bytes"] == 768 * MiB


def test_a_context_that_does_not_fit_is_refused(node):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", GPUSHARE_CONTEXT_RESERVE="600m")
    first = start(env, "init", "ctx", 0, "ready")
    try:
        assert until(first, "ready")[1]["rc"] == CUDA_SUCCESS
        second = run(env, "init", "ctx", 0)
        assert second[1]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    finally:
        first.stdin.close()
        first.wait(timeout=10)


def test_the_driver_refusing_rolls_the_reservation_back(tmp_path):
    node = make_node(tmp_path, n=1, memory_mib=2048)  # a 2 GiB GPU under an 8 GiB limit
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="8g"), "init", "ctx", 0,
                "fill", "alloc", "256m", "freeall", "meminfo", "fill", "alloc", "256m")
    assert steps[2]["bytes"] == 2 * GiB and steps[2]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert steps[4]["free"] == 2 * GiB and steps[4]["total"] == 2 * GiB
    assert steps[5]["bytes"] == 2 * GiB


def test_without_limits_the_shim_stays_out_of_the_way(node):
    result = run_full(node.env(), "init", "ctx", 0, "fill", "alloc", "1g", "meminfo", "freeall", "meminfo")
    assert result.step("fill")["bytes"] == 16 * GiB
    assert result.step("meminfo", 1)["total"] == 16 * GiB
    assert result.stderr == ""
