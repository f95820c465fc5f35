"""The fake libnvidia-ml.so.1's interconnect through the real pynvml: NVLink islands, the PCIe path between GPUs,
and the errors NVML gives for a bad link index or a GPU without NVLink."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pynvml
import pytest

from devplugin_sim.fake_driver import FakeDriver, FakeGPU, nvlink_node, seed_node

MAX_LINKS = 18  # nvml.h (R535+): NVML_NVLINK_MAX_LINKS


@pytest.fixture
def islands(make_driver: Callable[..., FakeDriver]) -> Iterator[list[FakeGPU]]:
    """8 GPUs in two NVLink islands of 4 (GPU 0..3 on NUMA node 0, GPU 4..7 on NUMA node 1), and GPU 8 with
    no NVLink and no NUMA node reported."""
    gpus = nvlink_node()
    gpus.append(FakeGPU(index=8, uuid="GPU-8badf00d-0000-0000-0000-000000000008", name="NVIDIA A100-PCIE-40GB",
                        memory_mib=40960, minor=8, pci_bus_id="00000000:20:00.0", numa_node=None))
    make_driver(gpus)
    pynvml.nvmlInit()
    yield gpus
    pynvml.nvmlShutdown()


def handle(i: int) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def linked(i: int) -> dict[int, str]:
    """Active link -> the bus id of the GPU at its far end."""
    out = {}
    for link in range(MAX_LINKS):
        if pynvml.nvmlDeviceGetNvLinkState(handle(i), link) == pynvml.NVML_FEATURE_ENABLED:
            out[link] = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle(i), link).busId
    return out


def test_each_gpu_of_an_island_is_linked_to_each_other_one(islands: list[FakeGPU]) -> None:
    bus = {g.index: g.pci_bus_id for g in islands}
    assert linked(0) == {0: bus[1], 1: bus[2], 2: bus[3]}
    assert linked(5) == {0: bus[4], 1: bus[6], 2: bus[7]}
    for i in range(8):
        peers = set(linked(i).values())
        island = range(0, 4) if i < 4 else range(4, 8)
        assert peers == {bus[j] for j in island if j != i}
        assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle(i), 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU


def test_inactive_links_report_disabled_and_have_no_remote(islands: list[FakeGPU]) -> None:
    assert pynvml.nvmlDeviceGetNvLinkState(handle(0), 3) == pynvml.NVML_FEATURE_DISABLED
    assert pynvml.nvmlDeviceGetNvLinkState(handle(0), MAX_LINKS - 1) == pynvml.NVML_FEATURE_DISABLED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle(0), 3)


def test_a_link_index_past_the_last_link_is_an_invalid_argument(islands: list[FakeGPU]) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkState(handle(0), MAX_LINKS)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle(0), 1000)


def test_a_gpu_without_nvlink_answers_not_supported(islands: list[FakeGPU]) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(handle(8), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle(8), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle(8), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNumaNodeId(handle(8))


def test_common_ancestor_is_node_within_a_numa_node_and_system_across(islands: list[FakeGPU]) -> None:
    level = pynvml.nvmlDeviceGetTopologyCommonAncestor
    assert level(handle(0), handle(0)) == pynvml.NVML_TOPOLOGY_INTERNAL
    assert level(handle(0), handle(3)) == pynvml.NVML_TOPOLOGY_NODE
    assert level(handle(4), handle(7)) == pynvml.NVML_TOPOLOGY_NODE
    assert level(handle(3), handle(4)) == pynvml.NVML_TOPOLOGY_SYSTEM
    assert level(handle(0), handle(8)) == pynvml.NVML_TOPOLOGY_SYSTEM  # GPU 8's NUMA node is not known
    assert [pynvml.nvmlDeviceGetNumaNodeId(handle(i)) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_node_without_nvlink_answers_not_supported_everywhere(seed_driver: FakeDriver) -> None:
    pynvml.nvmlInit()
    try:
        for i in range(len(seed_node())):
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkState(handle(i), 0)
        assert pynvml.nvmlDeviceGetTopologyCommonAncestor(handle(0), handle(1)) == pynvml.NVML_TOPOLOGY_NODE
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.parametrize("value", ["island0", "256", "-2", ""])
def test_a_bad_nvlink_value_in_the_config_is_refused_with_the_line(make_driver: Callable[..., FakeDriver],
                                                                    capfd: pytest.CaptureFixture[str],
                                                                    value: str) -> None:
    driver = make_driver()
    driver.config_path.write_text(f"gpu uuid=GPU-1 name=X memory_mib=1024 nvlink={value}\n")
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert f"{driver.config_path}:1: nvlink must be -1 (no NVLink) or an island id 0..255, got '{value}'" in err, err
