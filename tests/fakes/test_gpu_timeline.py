"""The fake GPU's shared timeline as NVML reports it: processes with a context under host pids (not their own),
whole-GPU and per-process utilisation with NVML's sample semantics, kernels of several processes sharing the GPU."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterator

import pynvml
import pytest

from devplugin_sim.fake_driver import FakeDriver
from devplugin_sim.gpu_share import Container
from tests.support.shim_probe import Node, go_on, go_on_together, gpus, next_step, require_built, start, until

OFFSET = 100000
SIM = {"FAKE_CUDA_NS_PER_BLOCK": "1000", "FAKE_CUDA_QUEUE_US": "20000"}


@pytest.fixture
def node(make_driver: Callable[..., FakeDriver], tmp_path) -> Iterator[Node]:
    require_built()
    driver = make_driver(gpus(1), host_pid_offset=OFFSET, sample_period_ms=50)
    pynvml.nvmlInit()
    yield Node(driver, tmp_path)
    pynvml.nvmlShutdown()


def finish(proc) -> None:
    proc.stdin.close()
    proc.wait(timeout=20)


def test_a_context_lists_the_process_under_its_host_pid(node: Node) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    idle = start(node.env(shim=False), "init", "ready", "ctx", 0, "ready")
    try:
        until(idle, "ready")
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []  # no context yet
        go_on(idle)
        until(idle, "ready")
        listed = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        assert listed == [idle.pid + OFFSET] and idle.pid not in listed
    finally:
        finish(idle)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []  # it ended


def test_running_process_list_reports_the_size_it_needs(node: Node, fake_nvml_lib: ctypes.CDLL) -> None:
    procs = [start(node.env(shim=False), "init", "ctx", 0, "ready") for _ in range(2)]
    try:
        for p in procs:
            until(p, "ready")
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        count = ctypes.c_uint(1)
        buf = (pynvml.c_nvmlProcessInfo_t * 1)()
        rc = fake_nvml_lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), buf)
        assert (rc, count.value) == (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 2)
        assert sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)) == sorted(
            p.pid + OFFSET for p in procs)
    finally:
        for p in procs:
            finish(p)


def test_per_process_utilisation_follows_the_kernels_each_process_ran(node: Node, fake_nvml_lib) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    busy = start(node.env(shim=False, **SIM), "init", "ctx", 0, "ready", "launchfor", "launch", 400, 1000, "ready")
    idle = start(node.env(shim=False, **SIM), "init", "ctx", 0, "ready")
    try:
        until(busy, "ready")
        until(idle, "ready")
        go_on(busy)
        time.sleep(0.3)
        # NULL buffer: INSUFFICIENT_SIZE and the count needed.
        count = ctypes.c_uint(0)
        rc = fake_nvml_lib.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(count), ctypes.c_ulonglong(0))
        assert rc == pynvml.NVML_ERROR_INSUFFICIENT_SIZE and count.value >= 1
        samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
        assert [s.pid for s in samples] == [busy.pid + OFFSET]  # the idle process had no utilisation
        assert samples[0].smUtil >= 80 and samples[0].timeStamp > (time.time() - 5) * 1e6
        assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu >= 80
        info = pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0)
        assert [(i.pid, i.smUtil >= 80) for i in info] == [(busy.pid + OFFSET, True)]
        assert next_step(busy)["op"] == "launchfor"
        until(busy, "ready")
        finish(busy)
        seen = max(s.timeStamp for s in samples)
        time.sleep(0.15)  # the next samples: the busy process is gone, the idle one used nothing
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetProcessUtilization(h, seen)
    finally:
        if busy.poll() is None:
            finish(busy)
        finish(idle)


def test_kernels_of_two_processes_share_the_gpu_timeline(node: Node) -> None:
    procs = [start(node.env(shim=False, **SIM), "init", "ctx", 0, "ready", "launchfor", "launch", 1200, 1000, "ready")
             for _ in range(2)]
    try:
        go_on_together(*procs)
        time.sleep(0.4)
        before, t0 = {t.pid: t.busy_ns for t in node.driver.process_times(0)}, time.monotonic()
        time.sleep(0.5)
        after, dt = node.driver.process_times(0), time.monotonic() - t0
        got = {t.pid: (t.busy_ns - before[t.pid]) / dt / 1e9 for t in after}
        assert sorted(got) == sorted(p.pid for p in procs)
        assert all(0.4 <= share <= 0.6 for share in got.values()), got  # one GPU, time-sliced
        assert {t.host_pid - t.pid for t in after} == {OFFSET}
    finally:
        for p in procs:
            finish(p)


def test_processes_utilization_info_checks_its_version(node: Node, fake_nvml_lib: ctypes.CDLL) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.c_nvmlProcessesUtilizationInfo_v1_t()
    info.version = pynvml.ProcessesUtilizationInfo_v1 + 1
    rc = fake_nvml_lib.nvmlDeviceGetProcessesUtilizationInfo(h, ctypes.byref(info))
    assert rc == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    info.version = pynvml.ProcessesUtilizationInfo_v1
    assert pynvml.ProcessesUtilizationInfo_v1 == 0x01000018
    rc = fake_nvml_lib.nvmlDeviceGetProcessesUtilizationInfo(h, ctypes.byref(info))  # NULL array
    assert rc == pynvml.NVML_ERROR_INSUFFICIENT_SIZE and info.processSamplesCount > 0


@pytest.mark.parametrize("setting,problem", [
    ({"sample_period_ms": 0}, "sample_period_ms must be 1..10000, not 0"),
    ({"sample_period_ms": 10001}, "sample_period_ms must be 1..10000, not 10001"),
    ({"host_pid_offset": -1}, "host_pid_offset must be 0..2^31-1, not -1"),
    ({"host_pid_offset": 1 << 31}, f"host_pid_offset must be 0..2^31-1, not {1 << 31}"),
])
def test_timeline_settings_out_of_range_are_refused_by_name(tmp_path, setting, problem) -> None:
    with pytest.raises(ValueError) as err:
        FakeDriver.create(tmp_path / "node", gpus(1), **setting)
    assert str(err.value) == problem
    assert not (tmp_path / "node").exists()  # refused before anything was written


@pytest.mark.parametrize("share,processes,problem", [
    (0, 1, "container c: share 0 is not a percentage 1..100"),
    (101, 1, "container c: share 101 is not a percentage 1..100"),
    (30, 0, "container c: needs at least one process, not 0"),
])
def test_a_share_bench_container_with_a_bad_setting_is_refused_by_name(share, processes, problem) -> None:
    with pytest.raises(ValueError) as err:
        Container("c", share=share, processes=processes)
    assert str(err.value) == problem
