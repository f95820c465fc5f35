"""enumerate_gpus() over the real pynvml and the fake driver: what the daemon learns about the node."""

from __future__ import annotations

import ctypes.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devplugin.gpu.device import GPU
from devplugin.gpu.inventory import NvmlUnavailable, enumerate_gpus
from devplugin_sim.fake_driver import FakeGPU, nvml_refcount, seed_node, seed_uuid

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]


def test_seed_node(seed_driver) -> None:
    gpus = enumerate_gpus()
    assert gpus == [
        GPU(index=i, uuid=seed_uuid(i), name="Tesla V100-SXM2-16GB", memory_bytes=15 * GIB, minor=i,
            pci_bus_id=f"00000000:00:{7 + i:02X}.0", numa_node=0)
        for i in range(4)
    ]
    assert nvml_refcount() == 0  # init and shutdown paired


def test_each_gpu_keeps_its_own_memory_size(make_driver) -> None:
    sizes = [80 * 1024, 80 * 1024, 24 * 1024, 24 * 1024]
    names = ["NVIDIA A100-SXM4-80GB"] * 2 + ["NVIDIA A10"] * 2
    make_driver([
        FakeGPU(i, f"GPU-{i}0000000-0000-0000-0000-000000000000", names[i], sizes[i], minor=10 + i,
                pci_bus_id=f"00000000:{0x17 + i:02X}:00.0", numa_node=i // 2, sms=108 if i < 2 else 72)
        for i in range(4)
    ])
    gpus = enumerate_gpus()
    assert [g.memory_bytes for g in gpus] == [80 * GIB, 80 * GIB, 24 * GIB, 24 * GIB]
    assert [g.name for g in gpus] == names
    assert [g.minor for g in gpus] == [10, 11, 12, 13]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    assert [g.pci_bus_id for g in gpus] == ["00000000:17:00.0", "00000000:18:00.0", "00000000:19:00.0",
                                            "00000000:1A:00.0"]


def test_numa_unknown_is_none(make_driver) -> None:
    make_driver([FakeGPU(0, seed_uuid(0), "NVIDIA T4", 15360, 0, "00000000:AF:00.0", numa_node=None)])
    assert enumerate_gpus()[0].numa_node is None


def test_a_lost_gpu_is_left_out_with_a_warning(seed_driver, caplog) -> None:
    seed_driver.set_lost(1, True)
    with caplog.at_level(logging.WARNING, logger="devplugin.gpu.inventory"):
        gpus = enumerate_gpus()
    assert [g.index for g in gpus] == [0, 2, 3]
    assert "GPU 1: NVML says the GPU is lost" in caplog.text


def test_bad_config_is_a_clear_error(make_driver, capfd) -> None:
    driver = make_driver()
    driver.config_path.write_text('gpu uuid=GPU-1 name="A" memory_mib=ten\n')
    with pytest.raises(NvmlUnavailable, match=r"nvmlInit: Unknown Error \(NVML error 999\)"):
        enumerate_gpus()
    assert f"{driver.config_path}:1: memory_mib must be a positive integer, got 'ten'" in capfd.readouterr().err
    assert nvml_refcount() == 0


def test_no_driver(make_driver, monkeypatch) -> None:
    make_driver()
    monkeypatch.delenv("FAKE_NVML_CONFIG")
    with pytest.raises(NvmlUnavailable) as exc:
        enumerate_gpus()
    message = str(exc.value)
    assert "Driver Not Loaded (NVML error 9)" in message
    assert "kernel driver is not loaded" in message and "nvidia-smi" in message


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed here")
def test_no_nvml_library_at_all() -> None:
    """A process without libnvidia-ml.so.1 on its path (no driver, or no NVIDIA runtime in the container)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_CONFIG")}
    script = (
        "from devplugin.gpu.inventory import NvmlUnavailable, enumerate_gpus\n"
        "try:\n    enumerate_gpus()\nexcept NvmlUnavailable as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=60).stdout
    assert "libnvidia-ml.so.1 was not found" in out
    assert "NVIDIA container runtime" in out


def test_in_another_process_through_env(seed_driver) -> None:
    """The way `devplugin serve` meets the fake: LD_LIBRARY_PATH and FAKE_NVML_CONFIG from driver.env()."""
    script = (
        "import dataclasses, json\n"
        "from devplugin.gpu.inventory import enumerate_gpus\n"
        "print(json.dumps([dataclasses.asdict(g) for g in enumerate_gpus()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, **seed_driver.env()}, cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    gpus = [GPU(**g) for g in json.loads(out)]
    assert [g.uuid for g in gpus] == [g.uuid for g in seed_node()]
    assert {g.memory_bytes for g in gpus} == {15 * GIB}
