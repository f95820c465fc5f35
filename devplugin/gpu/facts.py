"""What a DRA device publishes beyond the inventory: each GPU's CUDA compute capability and the driver version."""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

from devplugin.gpu import nvml
from devplugin.gpu.device import GPU


@dataclass(frozen=True)
class GpuFacts:
    """compute_capability: "8.0" (major.minor), "" when NVML does not say; driver_version: "550.54.15", "" likewise."""

    compute_capability: dict[str, str]  # GPU UUID -> "major.minor"
    driver_version: str


def read_facts(gpus: list[GPU]) -> GpuFacts:
    """Ask NVML once; a value NVML cannot give is left empty (the attribute is then not published)."""
    caps: dict[str, str] = {}
    with nvml.session():
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            driver = version.decode() if isinstance(version, bytes) else str(version)
        except pynvml.NVMLError:
            driver = ""
        for gpu in gpus:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                caps[gpu.uuid] = f"{int(major)}.{int(minor)}"
            except pynvml.NVMLError:
                caps[gpu.uuid] = ""
    return GpuFacts(compute_capability=caps, driver_version=driver)
