"""One GPU the node shares, as NVML describes it (devplugin/gpu/inventory.py reads them): a physical GPU, or a MIG
device shared as a GPU of its own (devplugin/gpu/mig.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """One physical GPU."""

    index: int  # NVML index
    uuid: str  # "GPU-..."; the identity everything else keys on
    name: str  # e.g. "Tesla V100-SXM2-16GB"
    memory_bytes: int  # this GPU's total memory as NVML reports it
    minor: int  # /dev/nvidia<minor>
    pci_bus_id: str  # "00000000:00:07.0"
    numa_node: int | None  # None when neither NVML nor sysfs says
    nvlink_island: int | None = None  # GPUs with the same island are joined by NVLink (gpu/topology.py)
    # A MIG device shared as a GPU of its own (gpu/mig.py): its GPU's UUID and NVML index, its profile. Its index
    # is a share index after the node's GPUs; minor, PCI bus, NUMA node and island are its GPU's.
    parent_uuid: str = ""
    parent_index: int | None = None
    mig_profile: str = ""
    reset_pending: bool = False  # its GPU's MIG mode changes at the next GPU reset: nothing new is placed here

    @property
    def is_mig(self) -> bool:
        return bool(self.parent_uuid)
