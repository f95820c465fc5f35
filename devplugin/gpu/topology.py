"""The node's NVLink islands, read through NVML: which GPUs are joined by NVLink, directly or through NVSwitches.

Each GPU's active links name the PCI device at their far end (`nvmlDeviceGetNvLinkRemotePciInfo_v2`): another
GPU, or an NVSwitch every GPU of the board reaches. GPUs that reach each other over links (through any number of
switches) form one island; islands are numbered 0, 1, ... by their lowest GPU index. A GPU with no active link,
or whose driver has no NVLink (NOT_SUPPORTED), is in no island. A GPU whose link calls fail otherwise is treated as
unconnected, with one warning per GPU for the daemon's life: placement then only loses a preference.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import pynvml

from devplugin.gpu.device import GPU

log = logging.getLogger(__name__)

MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of nvml.h R535+; later drivers answer INVALID_ARGUMENT past their last link
_warned: set[str] = set()  # GPU UUIDs whose topology could not be read (warned once)


class LinkReader(Protocol):
    """Where the far ends of a GPU's active NVLinks are read from (NVML on a node; a table in tests)."""

    def remotes(self, gpu: GPU) -> list[str]:
        """The PCI bus ids at the far end of the GPU's active links ([] without NVLink); pynvml.NVMLError when the
        driver cannot say."""
        ...


class NvmlLinks:
    """LinkReader over NVML; call inside an NVML session."""

    def remotes(self, gpu: GPU) -> list[str]:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        out = []
        for link in range(MAX_LINKS):
            try:
                active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError_NotSupported:
                if link == 0:
                    return []  # a GPU without NVLink
                continue  # a link this GPU does not have
            except pynvml.NVMLError_InvalidArgument:
                break  # past this GPU's last link
            if active == pynvml.NVML_FEATURE_ENABLED:
                out.append(bus_key(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        return out


def bus_key(bus_id: bytes | str) -> str:
    """A PCI bus id in one spelling ("00000000:10:00.0"), whatever the domain's width or the letters' case."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, _, rest = text.strip().partition(":")
    try:
        return f"{int(domain, 16):08X}:{rest.upper()}"
    except ValueError:
        return text.strip().upper()


def islands(gpus: Sequence[GPU], remotes: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """GPU UUID -> island id, for GPUs that reach at least one other GPU over NVLink. `remotes`: per GPU UUID, the
    bus ids at the far end of its active links."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for gpu in gpus:
        for far in remotes.get(gpu.uuid, ()):
            a, b = root(bus_key(gpu.pci_bus_id)), root(far)
            if a != b:
                parent[a] = b
    groups: dict[str, list[GPU]] = {}
    for gpu in gpus:
        groups.setdefault(root(bus_key(gpu.pci_bus_id)), []).append(gpu)
    joined = sorted((g for g in groups.values() if len(g) > 1), key=lambda g: min(x.index for x in g))
    return {gpu.uuid: number for number, group in enumerate(joined) for gpu in group}


def with_islands(gpus: Sequence[GPU], reader: LinkReader | None = None) -> list[GPU]:
    """The GPUs with their NVLink island set (None where they have none). NVML errors leave a GPU unconnected
    (warned once per GPU); they never fail the inventory."""
    reader = reader or NvmlLinks()
    remotes: dict[str, list[str]] = {}
    for gpu in gpus:
        try:
            remotes[gpu.uuid] = reader.remotes(gpu)
        except pynvml.NVMLError as err:
            remotes[gpu.uuid] = []
            if gpu.uuid not in _warned:
                _warned.add(gpu.uuid)
                log.warning("GPU %d (%s): its NVLinks cannot be read (%s); placement treats it as connected to no "
                            "other GPU", gpu.index, gpu.uuid, err,
                            extra={"fields": {"gpu_index": gpu.index, "gpu": gpu.uuid}})
    found = islands(gpus, remotes)
    return [replace(gpu, nvlink_island=found.get(gpu.uuid)) for gpu in gpus]
