"""cuCtxSetLimit reserves device memory for the stack (its size per thread, for every thread the GPU can hold at
once), the malloc heap and the printf FIFO. What a value above the driver's default adds is charged (the defaults
are part of the context's charge), given back when lowered, and refused with CUDA_ERROR_OUT_OF_MEMORY, before the
driver is asked, when it does not fit. The fake driver takes the same memory."""

from __future__ import annotations

import pytest

from tests.shim.vmm_probe import finish, held, run
from tests.support.shim_probe import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MiB
from tests.support.shim_probe import node as node  # the fixture

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}
STACK, PRINTF_FIFO, MALLOC_HEAP = 0, 1, 2
THREADS = 80 * 2048  # the fake V100: 80 SMs of 2048 threads


@pytest.mark.parametrize("mode", ["gpa", "dlsym"])
def test_a_larger_stack_is_charged_for_every_thread_the_gpu_holds(node, mode):
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "setlimit", STACK, "4k", "meminfo",
                       "setlimit", STACK, "8k", "getlimit", STACK, "meminfo", mode=mode)
    try:
        extra = (4096 - 1024) * THREADS  # 480 MiB
        assert [s["rc"] for s in steps if s["op"] == "setlimit"] == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
        assert [s["value"] for s in steps if s["op"] == "getlimit"] == [4096]  # the refused value never reached it
        assert [s["used"] for s in steps if s["op"] == "meminfo"] == [extra, extra]
        assert node.driver.memory_used(0) == extra
    finally:
        finish(proc)


def test_the_heap_and_the_printf_fifo_are_charged_and_lowering_gives_back(node):
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "setlimit", MALLOC_HEAP, "520m",
                       "setlimit", PRINTF_FIFO, "129m", "meminfo", "setlimit", MALLOC_HEAP, "8m", "meminfo",
                       "setlimit", MALLOC_HEAP, "1g", "setlimit", MALLOC_HEAP, "880m")
    try:
        assert [s["rc"] for s in steps if s["op"] == "setlimit"] == [
            CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
        assert [s["used"] for s in steps if s["op"] == "meminfo"] == [640 * MiB, 128 * MiB]
        assert node.driver.memory_used(0) == 1000 * MiB  # 872 MiB of heap above its 8 MiB, 128 of FIFO
    finally:
        finish(proc)


def test_the_limit_charge_leaves_with_the_process(node):
    env = node.env(**LIMIT)
    run(env, "init", "ctx", 0, "setlimit", STACK, "4k")
    assert run(env, "init", "ctx", 0, "create", "1g").steps[-1]["rc"] == CUDA_SUCCESS
