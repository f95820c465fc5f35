"""The node's GPUs as NVML reports them: index, UUID, name, each GPU's own memory size, minor, PCI bus, NUMA node,
NVLink island."""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml

from devplugin.gpu import mig, nvml, topology
from devplugin.gpu.device import GPU
from devplugin.gpu.nvml import NvmlUnavailable

__all__ = ["NvmlUnavailable", "enumerate_gpus"]

log = logging.getLogger(__name__)

SYSFS_PCI = Path("/sys/bus/pci/devices")


def enumerate_gpus() -> list[GPU]:
    """What the node shares, in NVML index order: every GPU NVML can see, each GPU in MIG mode as its MIG devices
    (gpu/mig.py).

    Each GPU keeps its own memory size, so mixed nodes (80 GiB next to 24 GiB) are described as they are.
    A GPU that NVML reports lost is left out with a warning; NvmlUnavailable when NVML itself cannot be used.
    """
    with nvml.session():
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise nvml.unavailable(err, "nvmlDeviceGetCount") from None
        gpus = []
        for index in range(count):
            try:
                gpus.append(_describe(index))
            except pynvml.NVMLError_GpuIsLost:
                log.warning(
                    "GPU %d: NVML says the GPU is lost (fell off the bus); it is not advertised until it is "
                    "reset and this daemon restarts", index, extra={"fields": {"gpu_index": index}},
                )
            except pynvml.NVMLError as err:
                raise nvml.unavailable(err, f"reading GPU {index}") from None
        gpus = topology.with_islands(gpus)
        try:
            layout = mig.read_layout(gpus)
        except pynvml.NVMLError as err:
            raise nvml.unavailable(err, "reading MIG modes and MIG devices") from None
        return mig.shared_devices(gpus, layout, first_mig_index=count)


def _describe(index: int) -> GPU:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    pci = pynvml.nvmlDeviceGetPciInfo(handle)
    bus_id = _text(pci.busId)
    return GPU(
        index=index,
        uuid=pynvml.nvmlDeviceGetUUID(handle),
        name=pynvml.nvmlDeviceGetName(handle),
        memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        minor=pynvml.nvmlDeviceGetMinorNumber(handle),
        pci_bus_id=bus_id,
        numa_node=_numa_node(handle, bus_id),
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _numa_node(handle: object, bus_id: str) -> int | None:
    """NVML's answer where the driver has it (R535+), else the kernel's (sysfs numa_node), else None."""
    try:
        node = pynvml.nvmlDeviceGetNumaNodeId(handle)
        return node if node >= 0 else None
    except pynvml.NVMLError:
        pass  # NOT_SUPPORTED, FUNCTION_NOT_FOUND on older drivers
    # sysfs names devices with a 4-digit domain, lower case: 0000:00:07.0
    domain, _, rest = bus_id.partition(":")
    try:
        text = (SYSFS_PCI / f"{int(domain, 16):04x}:{rest.lower()}" / "numa_node").read_text().strip()
        node = int(text)
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
