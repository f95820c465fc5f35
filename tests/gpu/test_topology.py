"""The daemon's reading of NVLink islands: through NVML over the fake driver, through NVSwitches, and with errors."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pynvml
import pytest

from devplugin.gpu import topology
from devplugin.gpu.device import GPU
from devplugin.gpu.inventory import enumerate_gpus
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, nvlink_node, seed_node


def gpu(i: int) -> GPU:
    return GPU(index=i, uuid=f"GPU-{i}", name="A100", memory_bytes=1 << 30, minor=i,
               pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=0)


def test_enumerate_reads_two_islands_of_four(make_driver: Callable[..., FakeDriver]) -> None:
    make_driver(nvlink_node())
    gpus = enumerate_gpus()
    assert [g.nvlink_island for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_node_without_nvlink_has_no_islands(make_driver: Callable[..., FakeDriver]) -> None:
    make_driver(seed_node())
    assert [g.nvlink_island for g in enumerate_gpus()] == [None] * 4


def test_a_gpu_linked_to_nothing_else_is_in_no_island(make_driver: Callable[..., FakeDriver]) -> None:
    gpus = nvlink_node(islands=1, per_island=3)
    lone = FakeGPU(index=3, uuid="GPU-3a0e0000-0000-0000-0000-000000000003", name="A100", memory_mib=1024, minor=3,
                   pci_bus_id="00000000:40:00.0", numa_node=0, nvlink_island=7)
    make_driver([*gpus, lone])
    assert [g.nvlink_island for g in enumerate_gpus()] == [0, 0, 0, None]


def test_gpus_behind_the_same_switches_are_one_island() -> None:
    gpus = [gpu(i) for i in range(6)]
    switches = ["00000000:A0:00.0", "00000000:A1:00.0"]
    remotes = {f"GPU-{i}": switches for i in range(4)}  # GPUs 0..3 on two NVSwitches; 4 and 5 linked directly
    remotes["GPU-4"] = ["0000:15:00.0"]
    remotes["GPU-5"] = ["00000000:14:00.0"]
    assert topology.islands(gpus, remotes) == {"GPU-0": 0, "GPU-1": 0, "GPU-2": 0, "GPU-3": 0,
                                               "GPU-4": 1, "GPU-5": 1}


class Failing:
    """A reader whose NVML answers UNKNOWN for GPU 1."""

    def __init__(self) -> None:
        self.calls = 0

    def remotes(self, g: GPU) -> list[str]:
        self.calls += 1
        if g.index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        peers = {0: [2], 2: [0]}.get(g.index, [])
        return [gpu(p).pci_bus_id for p in peers]


def test_a_gpu_whose_links_fail_is_unconnected_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [gpu(i) for i in range(3)]
    topology._warned.discard("GPU-1")
    with caplog.at_level(logging.WARNING, logger="devplugin.gpu.topology"):
        first = topology.with_islands(gpus, Failing())
        again = topology.with_islands(gpus, Failing())
    assert [g.nvlink_island for g in first] == [0, None, 0]
    assert again == first
    warnings = [r for r in caplog.records if "GPU 1 (GPU-1): its NVLinks cannot be read" in r.getMessage()]
    assert len(warnings) == 1
    assert "treats it as connected to no other GPU" in warnings[0].getMessage()
