"""MIG: each GPU's MIG mode and MIG devices, read through NVML, and the devices the node shares because of them.

A GPU in MIG mode is not shared itself: a container handed its UUID reaches only MIG devices. Each of its MIG
devices (a GPU instance with its compute instance, UUID `MIG-...`) is shared instead, as a GPU of its own: gpu-mem
from the MIG device's memory, gpu-core.percentage a percentage of the MIG device, gpu-count whole MIG devices.
A GPU without MIG, or with MIG off, is shared whole as before.

Share indices: a whole GPU keeps its NVML index; MIG devices are numbered after the node's GPUs (NVML's device
count, then one up per MIG device, GPU by GPU in NVML order, each GPU's MIG devices in NVML's MIG index order).

A GPU whose MIG mode waits for a reset (current and pending mode differ) is served as its current layout, with
`reset_pending` set on what it contributes: the daemon keeps those devices Unhealthy (no new placement) until the
layout changes (layout_watch.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pynvml

from devplugin.gpu.device import GPU

log = logging.getLogger(__name__)

_NO_MIG = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


@dataclass(frozen=True)
class MigDevice:
    """One MIG device as NVML reports it."""

    uuid: str  # "MIG-..."
    name: str  # "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    memory_bytes: int
    profile: str  # "1g.10gb"
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class MigState:
    """One GPU's MIG mode and MIG devices. current / pending None: the GPU cannot run MIG."""

    current: bool | None = None
    pending: bool | None = None
    devices: tuple[MigDevice, ...] = ()

    @property
    def reset_pending(self) -> bool:
        return self.current is not None and self.pending is not None and self.current != self.pending

    def describe(self) -> str:
        if self.current is None:
            return "no MIG"
        mode = "MIG on" if self.current else "MIG off"
        if self.reset_pending:
            mode += f", MIG {'on' if self.pending else 'off'} after a GPU reset"
        if self.current:
            mode += ": " + (", ".join(f"{d.profile} {d.uuid}" for d in self.devices) or "no MIG devices")
        return mode


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def profile_of(name: str, attrs: Any) -> str:
    """The profile from NVML's MIG device name ("... MIG 1g.10gb"); else from its slice counts and memory."""
    _, sep, profile = name.rpartition(" MIG ")
    if sep and profile:
        return profile
    gb = (int(attrs.memorySizeMB) + 1023) // 1024
    return f"{int(attrs.gpuInstanceSliceCount)}g.{gb}gb"


def read_state(handle: Any) -> MigState:
    """The GPU's MIG state (call inside an NVML session). pynvml.NVMLError for what NVML cannot answer, other than
    a GPU or driver without MIG."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as err:
        if err.value in _NO_MIG:
            return MigState()
        raise
    devices: list[MigDevice] = []
    if current:
        for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except pynvml.NVMLError_NotFound:
                continue
            name = _text(pynvml.nvmlDeviceGetName(mig))
            devices.append(MigDevice(
                uuid=_text(pynvml.nvmlDeviceGetUUID(mig)), name=name,
                memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(mig).total),
                profile=profile_of(name, pynvml.nvmlDeviceGetAttributes_v2(mig)),
                gpu_instance_id=int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance_id=int(pynvml.nvmlDeviceGetComputeInstanceId(mig))))
    return MigState(bool(current), bool(pending), tuple(devices))


def read_layout(gpus: Sequence[GPU], handle_of: Callable[[str], Any] | None = None) -> dict[str, MigState]:
    """Each physical GPU's MIG state by UUID (call inside an NVML session)."""
    get = handle_of or pynvml.nvmlDeviceGetHandleByUUID
    return {g.uuid: read_state(get(g.uuid)) for g in gpus}


def shared_devices(gpus: Sequence[GPU], layout: dict[str, MigState], first_mig_index: int) -> list[GPU]:
    """What the node shares: each GPU whole, or, in MIG mode, each of its MIG devices (module docstring)."""
    out: list[GPU] = []
    n = first_mig_index
    for gpu in gpus:
        state = layout.get(gpu.uuid, MigState())
        if not state.current:
            out.append(replace(gpu, reset_pending=state.reset_pending))
            continue
        if not state.devices:
            log.warning("GPU %d (%s) is in MIG mode with no MIG devices: nothing of it is shared; create GPU and "
                        "compute instances (nvidia-smi mig -cgi <profiles> -C) or turn MIG off (nvidia-smi -i %d "
                        "-mig 0) and reset the GPU", gpu.index, gpu.uuid, gpu.index,
                        extra={"fields": {"gpu_index": gpu.index, "gpu": gpu.uuid}})
        for dev in state.devices:
            out.append(replace(gpu, index=n, uuid=dev.uuid, name=dev.name, memory_bytes=dev.memory_bytes,
                               parent_uuid=gpu.uuid, parent_index=gpu.index, mig_profile=dev.profile,
                               reset_pending=state.reset_pending))
            n += 1
    return out
