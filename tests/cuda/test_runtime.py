"""NVIDIA's CUDA runtime over the fake driver, with the shim: an nvcc-built program (tests/cuda/rt_probe.cu),
linked with static and with shared cudart, run as a container's processes at a 2 GiB / 30 % slice of a 40 GiB
GPU. What a user of the runtime relies on: the slice is what the device reports, allocations stop at it with the
runtime's own error and the process goes on, the container's processes share it, NVML agrees, the compute
share holds on `<<<>>>` launches; and the allocation paths HAMi-core's users report trouble with (VMM growth,
stream-ordered pools, graphs that allocate, fork after init, threads at once, kernel images loaded as
libraries)."""

from __future__ import annotations

import time

import pytest

from tests.support.cuda_runtime import GiB, MiB, a100_node, run, runtime_probe, start, until

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "2g"}
OOM = "cudaErrorMemoryAllocation"


@pytest.fixture(params=["static", "shared"])
def probe(request):
    return runtime_probe(request.param)


@pytest.fixture
def node(tmp_path):
    return a100_node(tmp_path)


def test_without_the_shim_the_runtime_sees_the_whole_fake_gpu(node, probe):
    r = run(probe, node.env(shim=False), "init", "props", "meminfo", "copy")
    assert r.step("init")["error"] == "cudaSuccess"
    props = r.step("props")
    assert props["total"] == 40 * GiB and props["l2"] == 40 * MiB and props["smem_sm"] == 164 * 1024
    assert r.step("meminfo")["total"] == 40 * GiB
    assert r.step("copy")["same"] == 1  # host-backed device memory: a copy to the device and back round-trips


def test_the_device_is_the_slice_and_allocations_stop_at_it_with_the_runtimes_error(node, probe):
    r = run(probe, node.env(**LIMIT), "init", "meminfo", "fill", 256, "meminfo", "free", "alloc", 256,
            "freeall", "meminfo")
    assert (r.step("meminfo")["free"], r.step("meminfo")["total"]) == (2 * GiB, 2 * GiB)
    fill = r.step("fill")
    assert fill["count"] == 8 and fill["error"] == OOM  # the 9th 256 MiB allocation is refused
    assert r.step("meminfo", 1)["free"] == 0
    assert r.step("alloc")["error"] == "cudaSuccess"  # the process goes on: freed room is usable again
    assert r.step("meminfo", 2)["free"] == 2 * GiB  # all given back


def test_nvml_sees_what_the_runtime_sees(node, probe):
    r = run(probe, node.env(**LIMIT), "init", "alloc", 512, "meminfo", "nvml")
    mem, nvml = r.step("meminfo"), r.step("nvml")
    assert nvml["nvml_rc"] == 0
    assert (nvml["total"], nvml["free"]) == (mem["total"], mem["free"]) == (2 * GiB, 1536 * MiB)


def test_the_containers_processes_share_the_slice(node, probe):
    env = node.env(**LIMIT)
    first = start(probe, env, "init", "alloc", 1024, "ready")
    try:
        until(first, "ready")
        r = run(probe, env, "init", "meminfo", "fill", 256)
        assert r.step("meminfo")["free"] == GiB
        assert r.step("fill")["count"] == 4
    finally:
        first.communicate("\n", timeout=30)


def test_stream_ordered_allocations_and_pools_that_keep_their_memory_stop_at_the_slice(node, probe):
    r = run(probe, node.env(**LIMIT), "init", "async", 256, "freeall", "poolfill", 256, "freeall", "meminfo")
    assert r.step("async")["count"] == 8 and r.step("async")["error"] == OOM
    pool = r.step("poolfill")
    assert pool["count"] == 8 and pool["error"] == OOM
    assert pool["threshold"] == 2**64 - 1  # the release threshold reads back what was set
    assert pool["used"] == 8 * 256 * MiB
    assert r.step("meminfo")["free"] == 0  # freed into a pool that keeps everything: still held, still charged


def test_virtual_memory_growth_stops_at_the_slice(node, probe):
    # PyTorch's expandable segments: a reserved range grown by cuMemCreate + cuMemMap + cuMemSetAccess
    r = run(probe, node.env(**LIMIT), "init", "vmm", 20, "meminfo")
    assert r.step("vmm")["count"] == 2048 // 20
    assert r.step("vmm")["driver_rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY on the page that does not fit
    assert r.step("meminfo")["free"] < 20 * MiB


def test_vmm_pages_released_while_mapped_stay_charged(node, probe):
    # NVIDIA's VMM sample releases each handle right after mapping it: the mapping keeps the memory, so the charge
    # stays until the unmap. Before, each release gave the charge back and the pages ran on past the slice.
    proc = start(probe, node.env(**LIMIT), "init", "vmmsample", 20, "meminfo", "ready")
    try:
        steps = until(proc, "ready")
        sample = [s for s in steps if s["op"] == "vmmsample"][0]
        assert sample["count"] == 2048 // 20 and sample["driver_rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
        mem = [s for s in steps if s["op"] == "meminfo"][0]
        assert mem["total"] - mem["free"] == 102 * 20 * MiB == node.driver.memory_used(0)
    finally:
        proc.communicate("\n", timeout=30)


def test_a_larger_stack_is_charged_and_one_past_the_slice_refused(node, probe):
    # The stack is reserved for every thread the GPU holds at once (108 SMs x 2048 threads on the A100): 8 KiB
    # instead of 1 KiB takes 1512 MiB more, 16 KiB would take 3240 MiB, more than the 2 GiB slice.
    r = run(probe, node.env(**LIMIT), "init", "stack", 8, "meminfo", "stack", 16, "meminfo")
    first, second = r.step("stack"), r.step("stack", 1)
    assert first["error"] == "cudaSuccess" and first["stack"] == 8192
    assert second["error"] == OOM and second["stack"] == 8192
    assert r.step("meminfo")["free"] == r.step("meminfo", 1)["free"] == 2 * GiB - 7 * 1024 * 108 * 2048


def test_several_pools_that_keep_their_memory_share_the_slice(node, probe):
    # Each pool keeps what was freed into it (release threshold: no limit): the first keeps the whole slice, so a
    # second finds no room. Before, each pool could keep a slice's worth.
    r = run(probe, node.env(**LIMIT), "init", "pools", 2, 256, "meminfo")
    assert r.step("pools")["counts"] == [8, 0]
    assert r.step("meminfo")["free"] == 0


def test_graphs_that_allocate_are_charged(node, probe):
    r = run(probe, node.env(**LIMIT), "init", "graph", 512, "meminfo", "fill", 256)
    assert r.step("graph")["error"] == "cudaSuccess"
    assert r.step("meminfo")["free"] == 1536 * MiB
    assert r.step("fill")["count"] == 6


def test_a_fork_after_init_leaves_the_parents_charge(node, probe):
    r = run(probe, node.env(**LIMIT), "init", "alloc", 1024, "fork", "meminfo", "fill", 256)
    assert r.step("fork")["error"] == "cudaSuccess"
    assert r.step("meminfo")["free"] == GiB
    assert r.step("fill")["count"] == 4


def test_threads_allocating_at_once_never_pass_the_slice(node, probe):
    r = run(probe, node.env(**LIMIT), "init", "threads", 4, 128, "meminfo")
    assert r.step("threads")["count"] == 16 and r.step("threads")["error"] == OOM
    assert r.step("meminfo")["free"] == 0


def test_kernel_images_loaded_as_libraries_are_charged(node, probe):
    r = run(probe, node.env(**LIMIT), "init", "library", 64, "meminfo", "library", 4096, "fill", 256)
    assert r.step("library")["error"] == "cudaSuccess"
    assert r.step("meminfo")["free"] == 2 * GiB - 64 * MiB
    assert r.step("library", 1)["error"] == OOM
    assert r.step("fill")["count"] == 7


@pytest.mark.parametrize("via_export", ["0", "1"], ids=["driver-creates-context-privately", "through-export"])
def test_the_compute_share_holds_on_runtime_launches(node, via_export):
    # cudart gets its primary context through the driver's private table: created there by the driver (as a
    # real one does) or through the exported cuDevicePrimaryCtxRetain. Either way the shim learns the process's
    # NVML pid and holds the share.
    probe = runtime_probe("static")
    env = node.env(CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="force",
                   GPUSHARE_GPU_LOCK_DIR=str(node.dir), FAKE_CUDA_NS_PER_BLOCK="1000", FAKE_CUDA_QUEUE_US="20000",
                   FAKE_CUDA_PRIMARY_CTX_VIA_EXPORT=via_export)
    proc = start(probe, env, "init", "launchfor", 3500, 1000)
    try:
        time.sleep(1.5)
        before, t0 = _busy(node, proc.pid), time.monotonic()
        time.sleep(1.5)
        share = 100.0 * (_busy(node, proc.pid) - before) / ((time.monotonic() - t0) * 1e9)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "NVML pid" not in err, err
    assert abs(share - 30) <= 5, share


def _busy(node, pid: int) -> int:
    return sum(t.busy_ns for t in node.driver.process_times(0) if t.pid == pid)
