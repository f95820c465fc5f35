"""NVML sessions for the rest of devplugin/gpu: init and shutdown in pairs, errors turned into advice."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pynvml


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node; the message says why and what to do."""


_ADVICE = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed on this node, or this container "
        "was not started with the NVIDIA container runtime (set runtimeClassName: nvidia or make nvidia the "
        "default runtime, and NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility on the DaemonSet)"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded: check `nvidia-smi` on the host, install or load the driver, "
        "or run this DaemonSet only on GPU nodes (nodeSelector on a GPU label)"
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "no permission to open the GPU device files: run the DaemonSet with NVIDIA_VISIBLE_DEVICES=all under "
        "the NVIDIA runtime, or privileged"
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "the NVIDIA user-space library and kernel module versions differ (driver upgraded without reboot): "
        "reboot the node or reload the nvidia kernel modules"
    ),
}


def describe(err: pynvml.NVMLError) -> str:
    """'<NVML's text> (NVML error <code>)'."""
    return f"{err} (NVML error {err.value})"


def unavailable(err: pynvml.NVMLError, doing: str) -> NvmlUnavailable:
    advice = _ADVICE.get(err.value, "check `nvidia-smi` on the node and the driver's kernel log (dmesg)")
    return NvmlUnavailable(f"NVML is unavailable ({doing}: {describe(err)}): {advice}")


def init() -> None:
    """nvmlInit, raising NvmlUnavailable. Pair with shutdown(): NVML counts inits."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise unavailable(err, "nvmlInit") from None


def shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass  # already shut down: nothing to release


@contextmanager
def session() -> Iterator[None]:
    init()
    try:
        yield
    finally:
        shutdown()
