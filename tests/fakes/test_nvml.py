"""The fake libnvidia-ml.so.1 through the real pynvml: what it reports, its errors, and its XID events."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pynvml
import pytest

from devplugin_sim.fake_driver import (
    STATE_SIZE,
    FakeDriver,
    FakeGPU,
    c_state_layout,
    python_state_layout,
    seed_node,
    seed_uuid,
)

XID = pynvml.nvmlEventTypeXidCriticalError
GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def nvml(seed_driver: FakeDriver):
    pynvml.nvmlInit()
    yield seed_driver
    pynvml.nvmlShutdown()


def test_state_layout_matches_the_c_header() -> None:
    assert python_state_layout() == c_state_layout()


def test_seed_node_as_pynvml_sees_it(nvml: FakeDriver) -> None:
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlDeviceGetCount() == 4
    for i in range(4):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        assert pynvml.nvmlDeviceGetIndex(h) == i
        assert pynvml.nvmlDeviceGetUUID(h) == seed_uuid(i)
        assert pynvml.nvmlDeviceGetName(h) == "Tesla V100-SXM2-16GB"
        assert pynvml.nvmlDeviceGetMinorNumber(h) == i
        assert pynvml.nvmlDeviceGetNumaNodeId(h) == 0
        assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == (7, 0)
        assert pynvml.nvmlDeviceGetAttributes(h).multiprocessorCount == 80
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        assert pci.busId == f"00000000:00:{7 + i:02X}.0"
        assert pci.busIdLegacy == f"0000:00:{7 + i:02X}.0"
        assert (pci.domain, pci.bus, pci.device) == (0, 0, 7 + i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        assert (mem.total, mem.free, mem.used) == (15 * GIB, 15 * GIB, 0)
        assert pynvml.nvmlDeviceGetHandleByUUID(seed_uuid(i)).contents is not None
        assert ctypes.addressof(pynvml.nvmlDeviceGetHandleByUUID(seed_uuid(i)).contents) == ctypes.addressof(
            h.contents
        )
        by_bus = pynvml.nvmlDeviceGetHandleByPciBusId(f"00000000:00:{7 + i:02X}.0")
        assert ctypes.addressof(by_bus.contents) == ctypes.addressof(h.contents)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(4)


def test_memory_and_utilisation_follow_the_state_file_live(nvml: FakeDriver) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    nvml.set_memory_used(2, 3 * GIB)
    nvml.set_utilization(2, 42, memory_percent=7)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert (mem.total, mem.free, mem.used) == (15 * GIB, 12 * GIB, 3 * GIB)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.free, v2.used) == (15 * GIB, 0, 12 * GIB, 3 * GIB)
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (42, 7)
    other = pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert (other.gpu, other.memory) == (0, 0)
    nvml.set_memory_used(2, 99 * GIB)  # more than the GPU has: free stays >= 0
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert (mem.free, mem.used) == (0, 15 * GIB)


def test_memory_v2_checks_the_struct_version(nvml: FakeDriver) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h, version=0x01000028)


def test_reserved_memory(make_driver) -> None:
    driver = make_driver(seed_node(1))
    text = driver.config_path.read_text().replace("memory_mib=15360", "memory_mib=15360 reserved_mib=512")
    driver.config_path.write_text(text)
    driver.set_memory_used(0, GIB)
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    finally:
        pynvml.nvmlShutdown()
    assert (v1.total, v1.used, v1.free) == (15 * GIB, GIB + GIB // 2, 15 * GIB - GIB - GIB // 2)
    assert (v2.reserved, v2.used, v2.free) == (GIB // 2, GIB, v1.free)


def test_no_processes_and_no_per_process_utilisation_before_a_context(nvml: FakeDriver) -> None:
    # Processes and their utilisation (tests/fakes/test_gpu_timeline.py) appear once a process creates a context.
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)


def test_init_is_reference_counted(fake_nvml_lib: ctypes.CDLL, seed_driver: FakeDriver) -> None:
    count = ctypes.c_uint()
    assert fake_nvml_lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == pynvml.NVML_ERROR_UNINITIALIZED
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 4  # one init still open
    pynvml.nvmlShutdown()
    assert fake_nvml_lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == pynvml.NVML_ERROR_UNINITIALIZED
    assert fake_nvml_lib.nvmlShutdown() == pynvml.NVML_ERROR_UNINITIALIZED
    assert fake_nvml_lib.nvmlInit_v2() == 0 and fake_nvml_lib.nvmlShutdown() == 0


def test_config_is_read_at_each_first_init(make_driver) -> None:
    make_driver(seed_node(4))
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 4
    pynvml.nvmlShutdown()
    make_driver([FakeGPU(0, "GPU-11111111-2222-3333-4444-555555555555", "NVIDIA A10", 23028, 0, "00000000:00:1E.0")])
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetCount() == 1
        assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA A10"
    finally:
        pynvml.nvmlShutdown()


def test_no_config_is_a_node_without_driver(make_driver, monkeypatch, capfd) -> None:
    make_driver()
    monkeypatch.delenv("FAKE_NVML_CONFIG")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert "FAKE_NVML_CONFIG is not set" in capfd.readouterr().err


GOOD = 'gpu uuid=GPU-1 name="X" memory_mib=1024'


@pytest.mark.parametrize(
    ("lines", "line_no", "problem"),
    [
        (["driver_version=1", "gpu uuid=GPU-1 name=X memory_mb=1024"], 2, "unknown gpu key 'memory_mb'"),
        (["gpu name=X memory_mib=1024"], 1, "gpu line without uuid"),
        (["gpu uuid=GPU-1 name=X memory_mib=lots"], 1, "memory_mib must be a positive integer, got 'lots'"),
        (["gpu uuid=GPU-1 name=X memory_mib=0"], 1, "memory_mib must be a positive integer"),
        (['gpu uuid=GPU-1 name="NVIDIA A10 memory_mib=1024'], 1, "unterminated quote in the value of name"),
        (["gpu uuid=abc name=X memory_mib=1"], 1, "uuid must look like GPU-"),
        (["gpu uuid=GPU-1 name=X memory_mib=1 pci=0:0:0"], 1, "pci must look like 00000000:00:08.0"),
        ([GOOD, "", "# c", GOOD], 4, "same uuid or pci as the GPU on line 1"),
        (["cuda_version=twelve"], 1, "cuda_version must look like 12040"),
        (["gpus=4"], 1, "unknown setting 'gpus'"),
        (["gpu uuid=GPU-1 name=X memory_mib=1 numa"], 1, "expected key=value, got 'numa'"),
        ([f"gpu uuid=GPU-{i} name=X memory_mib=1 pci=00000000:{i:02X}:00.0" for i in range(17)], 17, "more than 16"),
    ],
)
def test_bad_config_fails_init_naming_file_line_and_problem(make_driver, capfd, lines, line_no, problem) -> None:
    driver = make_driver()
    driver.config_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert f"fake NVML: bad config {driver.config_path}:{line_no}: {problem}" in err, err
    assert err.count("\n") == 1


def test_missing_config_file(make_driver, capfd) -> None:
    driver = make_driver()
    driver.config_path.unlink()
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    assert f"{driver.config_path}: cannot open" in capfd.readouterr().err


def test_handwritten_config_gets_defaults_and_a_state_file(make_driver, tmp_path) -> None:
    make_driver()  # only for its FAKE_NVML_CONFIG handling; point it elsewhere
    config = tmp_path / "hand.conf"
    config.write_text('  # a comment\ngpu uuid=GPU-abc name="My GPU" memory_mib=2048   # trailing comment\n')
    os.environ["FAKE_NVML_CONFIG"] = str(config)
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetName(h) == "My GPU"
        assert pynvml.nvmlDeviceGetMinorNumber(h) == 0
        assert pynvml.nvmlDeviceGetPciInfo(h).busId == "00000000:01:00.0"
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNumaNodeId(h)
        assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    finally:
        pynvml.nvmlShutdown()
    assert (tmp_path / "hand.conf.state").stat().st_size == STATE_SIZE
    attached = FakeDriver.attach(config)
    assert attached.gpus[0].name == "My GPU" and attached.gpus[0].numa_node is None
    attached.close()


def test_lost_gpu_answers_gpu_is_lost_until_it_is_back(nvml: FakeDriver) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    nvml.set_lost(1, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByUUID(seed_uuid(1))
    assert pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total == 15 * GIB
    nvml.set_lost(1, False)
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 15 * GIB


# ---- events ---------------------------------------------------------------------------------------------


@pytest.fixture
def event_set(nvml: FakeDriver):
    s = pynvml.nvmlEventSetCreate()
    yield s
    pynvml.nvmlEventSetFree(s)


def _register(event_set, *indices: int) -> None:
    for i in indices:
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), XID, event_set)


def test_xid_reaches_a_set_registered_for_that_gpu_only(nvml: FakeDriver, event_set) -> None:
    _register(event_set, 1)
    assert pynvml.nvmlDeviceGetSupportedEventTypes(pynvml.nvmlDeviceGetHandleByIndex(1)) & XID
    nvml.raise_xid(0, 79)  # GPU 0 is not registered: not delivered
    nvml.raise_event(1, pynvml.nvmlEventTypePState)  # not a registered type: not delivered
    nvml.raise_xid(1, 48)
    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventType, data.eventData) == (XID, 48)
    assert pynvml.nvmlDeviceGetUUID(data.device) == seed_uuid(1)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 50)


def test_events_before_the_set_existed_are_not_delivered(nvml: FakeDriver) -> None:
    nvml.raise_xid(0, 79)
    s = pynvml.nvmlEventSetCreate()
    try:
        _register(s, 0)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(s, 50)
    finally:
        pynvml.nvmlEventSetFree(s)


def test_wait_blocks_without_using_cpu(nvml: FakeDriver, event_set) -> None:
    _register(event_set, 0, 1, 2, 3)
    start, cpu = time.monotonic(), time.thread_time()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 600)
    elapsed, used = time.monotonic() - start, time.thread_time() - cpu
    assert 0.55 <= elapsed < 1.5
    assert used < 0.05, f"the wait used {used:.3f} s of CPU in {elapsed:.2f} s"


def test_wait_wakes_as_soon_as_an_event_arrives(nvml: FakeDriver, event_set) -> None:
    _register(event_set, 3)
    timer = threading.Timer(0.2, nvml.raise_xid, (3, 79))
    timer.start()
    start = time.monotonic()
    data = pynvml.nvmlEventSetWait_v2(event_set, 10_000)
    assert data.eventData == 79
    assert time.monotonic() - start < 0.5
    timer.join()


def test_every_set_gets_every_event_once(nvml: FakeDriver) -> None:
    sets = [pynvml.nvmlEventSetCreate() for _ in range(3)]
    try:
        for s in sets:
            _register(s, 0, 2)
        for xid in (79, 48, 63):
            nvml.raise_xid(2 if xid == 48 else 0, xid)
        for s in sets:
            got = [pynvml.nvmlEventSetWait_v2(s, 1000) for _ in range(3)]
            assert [(pynvml.nvmlDeviceGetIndex(d.device), d.eventData) for d in got] == [(0, 79), (2, 48), (0, 63)]
            with pytest.raises(pynvml.NVMLError_Timeout):
                pynvml.nvmlEventSetWait_v2(s, 20)
    finally:
        for s in sets:
            pynvml.nvmlEventSetFree(s)


def test_many_waiting_threads_all_wake(nvml: FakeDriver) -> None:
    sets = [pynvml.nvmlEventSetCreate() for _ in range(4)]
    results: list[int] = []
    try:
        for s in sets:
            _register(s, 1)

        def wait(s) -> None:
            results.append(pynvml.nvmlEventSetWait_v2(s, 5000).eventData)

        threads = [threading.Thread(target=wait, args=(s,)) for s in sets]
        for t in threads:
            t.start()
        time.sleep(0.1)
        nvml.raise_xid(1, 94)
        for t in threads:
            t.join(2)
        assert results == [94, 94, 94, 94]
    finally:
        for s in sets:
            pynvml.nvmlEventSetFree(s)


def test_lost_gpu_wakes_its_waiters_with_gpu_is_lost(nvml: FakeDriver, event_set) -> None:
    _register(event_set, 0, 2)
    nvml.set_lost(1, True)  # not registered: nothing
    nvml.set_lost(2, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(event_set, 1000)
    with pytest.raises(pynvml.NVMLError_Timeout):  # once, not on every wait
        pynvml.nvmlEventSetWait_v2(event_set, 20)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(2), XID, event_set)


def test_gpu_without_event_support(make_driver) -> None:
    gpus = seed_node(2)
    gpus[1] = FakeGPU(1, seed_uuid(1), "NVIDIA T4", 15360, 1, "00000000:00:08.0", events_supported=False)
    make_driver(gpus)
    pynvml.nvmlInit()
    s = pynvml.nvmlEventSetCreate()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetSupportedEventTypes(h) == 0
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceRegisterEvents(h, XID, s)
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(0), XID, s)
    finally:
        pynvml.nvmlEventSetFree(s)
        pynvml.nvmlShutdown()


def test_a_set_outliving_its_init_cycle(seed_driver: FakeDriver) -> None:
    pynvml.nvmlInit()
    s = pynvml.nvmlEventSetCreate()
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlEventSetWait_v2(s, 10)
    pynvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_Uninitialized):  # made before the last shutdown
            pynvml.nvmlEventSetWait_v2(s, 10)
    finally:
        pynvml.nvmlEventSetFree(s)
        pynvml.nvmlShutdown()


def test_ring_overflow_drops_the_oldest_events(nvml: FakeDriver, event_set, capfd) -> None:
    _register(event_set, 0)
    for xid in range(1, 71):  # 70 events, ring of 64
        nvml.raise_xid(0, xid)
    first = pynvml.nvmlEventSetWait_v2(event_set, 100)
    assert first.eventData == 7
    assert "fell 6 events behind" in capfd.readouterr().err


def test_events_cross_processes(seed_driver: FakeDriver) -> None:
    """A daemon in another process, loading the fake by LD_LIBRARY_PATH, wakes on an XID raised here."""
    script = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "s = pynvml.nvmlEventSetCreate()\n"
        "pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(3), 8, s)\n"
        "print('ready', flush=True)\n"
        "d = pynvml.nvmlEventSetWait_v2(s, 10000)\n"
        "print(pynvml.nvmlDeviceGetUUID(d.device), d.eventData, flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **seed_driver.env()},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        start = time.monotonic()
        seed_driver.raise_xid(3, 79)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - start < 2
        assert out.split() == [seed_uuid(3), "79"], err
    finally:
        proc.kill()
        proc.wait()
