"""The fake libnvidia-ml.so.1's MIG mode through the real pynvml: MIG modes (pending a reset too), MIG devices
by index and by UUID with their memory, name, SMs and instance ids, NVML's error codes, and a layout rewritten
while NVML is initialised."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from devplugin_sim.fake_driver import CONFIG_ENV, FakeDriver, FakeGPU, seed_node
from devplugin_sim.mig_layouts import a100, mig_node

MiB = 1 << 20


@pytest.fixture
def node(make_driver: Callable[..., FakeDriver]) -> Iterator[tuple[FakeDriver, list[FakeGPU]]]:
    gpus = [*mig_node(), dataclasses.replace(seed_node(4)[3], index=3)]  # GPU 3: a V100, no MIG support
    driver = make_driver(gpus)
    pynvml.nvmlInit()
    yield driver, gpus
    pynvml.nvmlShutdown()


def handle(i: int) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def migs_of(i: int) -> list[object]:
    out = []
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(i))):
        try:
            out.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(i), k))
        except pynvml.NVMLError_NotFound:
            continue
    return out


def test_mig_modes_as_configured(node: tuple[FakeDriver, list[FakeGPU]]) -> None:
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 0]
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(handle(3))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(3))
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0)) == 0
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(1)) == 7


def test_mig_devices_answer_as_devices_of_their_own(node: tuple[FakeDriver, list[FakeGPU]]) -> None:
    _, gpus = node
    migs = migs_of(1)
    want = gpus[1].mig_devices
    assert len(migs) == 3
    for h, m in zip(migs, want, strict=True):
        assert pynvml.nvmlDeviceIsMigDeviceHandle(h).value == 1
        assert pynvml.nvmlDeviceGetUUID(h) == m.uuid
        assert pynvml.nvmlDeviceGetName(h) == f"NVIDIA A100-SXM4-80GB MIG {m.profile}"
        assert pynvml.nvmlDeviceGetMemoryInfo(h).total == m.memory_mib * MiB
        attrs = pynvml.nvmlDeviceGetAttributes_v2(h)
        assert attrs.multiprocessorCount == m.sms
        assert attrs.memorySizeMB == m.memory_mib
        assert attrs.gpuInstanceSliceCount == int(m.profile[0])
        assert pynvml.nvmlDeviceGetGpuInstanceId(h) == m.gi
        assert pynvml.nvmlDeviceGetComputeInstanceId(h) == m.ci
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)
        assert pynvml.nvmlDeviceGetUUID(parent) == gpus[1].uuid
        by_uuid = pynvml.nvmlDeviceGetHandleByUUID(m.uuid)
        assert pynvml.nvmlDeviceGetMemoryInfo(by_uuid).total == m.memory_mib * MiB
    assert pynvml.nvmlDeviceIsMigDeviceHandle(handle(1)).value == 0
    assert pynvml.nvmlDeviceGetCount() == 4  # MIG devices are not counted as GPUs


def test_memory_used_in_a_mig_device_is_its_own_and_its_gpus(node: tuple[FakeDriver, list[FakeGPU]]) -> None:
    driver, gpus = node
    small = gpus[1].mig_devices[2]
    driver.set_memory_used(driver.mig_slot(small.uuid), 1024 * MiB)
    h = pynvml.nvmlDeviceGetHandleByUUID(small.uuid)
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 1024 * MiB
    assert pynvml.nvmlDeviceGetMemoryInfo(migs_of(1)[0]).used == 0
    assert pynvml.nvmlDeviceGetMemoryInfo(handle(1)).used == 1024 * MiB


def test_nvml_error_codes(node: tuple[FakeDriver, list[FakeGPU]]) -> None:
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(1), 3)  # room for 7, three exist
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(1), 7)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(0), 0)  # MIG off
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle(3), 0)  # no MIG at all
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceId(handle(1))  # a GPU, not a MIG device
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle(1))
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("MIG-00000000-0000-0000-0000-000000000000")
    mig = migs_of(1)[0]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigMode(mig)  # a MIG device has no MIG mode of its own
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(mig)


def test_a_mig_device_is_lost_with_its_gpu(node: tuple[FakeDriver, list[FakeGPU]]) -> None:
    driver, gpus = node
    mig = migs_of(1)[0]
    driver.set_lost(1, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(mig)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByUUID(gpus[1].mig_devices[0].uuid)


def test_pending_modes_and_a_layout_rewritten_while_initialised(make_driver: Callable[..., FakeDriver]) -> None:
    gpus = [a100("p", 0, mig=False, mig_pending=True), a100("p", 1, mig=True, mig_pending=False,
                                                             profiles=("7g.80gb",))]
    driver = make_driver(gpus)
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 1]
        assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [1, 0]
        assert len(migs_of(1)) == 1
        # The operator resets GPU 0 (MIG on, two instances) and GPU 1 (MIG off), NVML still initialised.
        after = [a100("p", 0, mig=True, profiles=("3g.40gb", "3g.40gb")), a100("p", 1, mig=False)]
        driver.rewrite(after)
        assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [1, 1]
        assert [pynvml.nvmlDeviceGetUUID(h) for h in migs_of(0)] == [m.uuid for m in after[0].mig_devices]
        assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [0, 0]
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID(gpus[1].mig_devices[0].uuid)
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.parametrize(("lines", "problem"), [
    (["gpu uuid=GPU-1 name=A memory_mib=1000 mig=0",
      "mig parent=GPU-1 uuid=MIG-2 profile=1g.5gb memory_mib=500 sms=14"], "current MIG mode is not enabled"),
    (["gpu uuid=GPU-1 name=A memory_mib=1000 mig=1",
      "mig parent=GPU-1 uuid=MIG-2 profile=1g.5gb memory_mib=600 sms=14 gi=1",
      "mig parent=GPU-1 uuid=MIG-3 profile=1g.5gb memory_mib=600 sms=14 gi=2"], "hold more memory than it has"),
    (["gpu uuid=GPU-1 name=A memory_mib=1000 mig=1",
      "mig parent=GPU-1 uuid=GPU-2 profile=1g.5gb memory_mib=500 sms=14"], "must look like MIG-"),
    (["gpu uuid=GPU-1 name=A memory_mib=1000 mig_pending=1"], "mig_pending= needs mig="),
    (["gpu uuid=GPU-1 name=A memory_mib=1000 mig=1",
      "mig parent=GPU-9 uuid=MIG-2 profile=1g.5gb memory_mib=500 sms=14"], "is not a gpu line"),
])
def test_bad_mig_configs_are_refused_at_init(lines: list[str], problem: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
                                             fake_nvml_lib: object) -> None:
    config = tmp_path / "nvml.conf"
    config.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv(CONFIG_ENV, str(config))
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    assert problem in capfd.readouterr().err
