"""The contract between the node daemon and the isolation shim: env names, mount paths, file formats.

This module is the single source of truth. `shim/gpushare_contract.h` is generated from it
(`python -m devplugin.contract > shim/gpushare_contract.h`, or `make contract`) and a test fails
when the header is stale. The env names are HAMi-core's (so either shim works with our daemon)
plus Alibaba Cloud ACK's `ALIYUN_COM_GPU_MEM_*` names for applications that read them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

# --- Env set by the daemon on Allocate -------------------------------------------------------
# Which GPU(s) the container sees: GPU UUIDs, comma separated (read by the NVIDIA container runtime).
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# ACK names, for applications that limit themselves (mode `share`) and for cGPU compatibility.
ENV_ALIYUN_MEM_IDX = "ALIYUN_COM_GPU_MEM_IDX"  # GPU index on the node
ENV_ALIYUN_MEM_DEV = "ALIYUN_COM_GPU_MEM_DEV"  # the GPU's total memory, in gpu-mem units
ENV_ALIYUN_MEM_CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"  # this container's memory, in gpu-mem units
ENV_ALIYUN_MEM_UNIT = "ALIYUN_COM_GPU_MEM_UNIT"  # size of one gpu-mem unit, e.g. "GiB" or "512MiB"
# HAMi-core names, read by the shim (and by HAMi-core's libvgpu.so).
ENV_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"  # all devices; per device: CUDA_DEVICE_MEMORY_LIMIT_<i>
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"  # percent of one GPU's compute; 0 or unset = 100
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"  # file where a container's processes account usage
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"  # default | force | disable
ENV_LOG_LEVEL = "LIBCUDA_LOG_LEVEL"  # 0..4
# Our own names.
ENV_LIMITS_FILE = "GPUSHARE_LIMITS_FILE"  # where the read-only limits file is mounted
ENV_REAL_LIBCUDA = "GPUSHARE_REAL_LIBCUDA"  # path of the real libcuda.so.1 (tests point it at the fake)
ENV_REAL_LIBNVML = "GPUSHARE_REAL_LIBNVML"  # path of the real libnvidia-ml.so.1 (tests likewise)
ENV_CONTEXT_RESERVE = "GPUSHARE_CONTEXT_RESERVE"  # device memory charged per process for its CUDA context

CORE_POLICIES = ("default", "force", "disable")

# --- Paths inside the container ---------------------------------------------------------------
CONTAINER_LIB_PATH = "/usr/local/gpushare/lib/libgpushare.so"
CONTAINER_PRELOAD_PATH = "/etc/ld.so.preload"
CONTAINER_LIMITS_PATH = "/etc/gpushare/limits"
CONTAINER_STATE_DIR = "/var/run/gpushare"
CONTAINER_SHARED_CACHE = CONTAINER_STATE_DIR + "/usage.cache"

# --- The limits file --------------------------------------------------------------------------
# Text, one `key=value` a line, `#` starts a comment. It wins over every env var above.
#   version=1
#   devices=<n>
#   device.<i>.uuid=GPU-...          container-local ordinal i, matched to CUDA devices by UUID
#   device.<i>.memory_limit=<bytes>  0 = no memory limit
#   device.<i>.sm_limit=<percent>    1..100; 100 = no compute limit
#   core_policy=default|force|disable
LIMITS_VERSION = 1
LIMITS_MAX_DEVICES = 16


@dataclass(frozen=True)
class DeviceLimit:
    """The limits of one GPU as one container sees it."""

    uuid: str
    memory_limit: int  # bytes, 0 = unlimited
    sm_limit: int = 100  # percent of the GPU


@dataclass(frozen=True)
class Limits:
    """Everything the limits file says."""

    devices: tuple[DeviceLimit, ...]
    core_policy: str = "default"


class LimitsFileError(ValueError):
    """A limits file that cannot be trusted; the message says which line and why."""


def render_limits(limits: Limits) -> str:
    """Serialise limits to the text format above."""
    if limits.core_policy not in CORE_POLICIES:
        raise LimitsFileError(f"core_policy {limits.core_policy!r} is not one of {CORE_POLICIES}")
    if not 1 <= len(limits.devices) <= LIMITS_MAX_DEVICES:
        raise LimitsFileError(f"a container has 1..{LIMITS_MAX_DEVICES} devices, not {len(limits.devices)}")
    lines = [f"version={LIMITS_VERSION}", f"devices={len(limits.devices)}"]
    for i, dev in enumerate(limits.devices):
        if dev.memory_limit < 0 or not 1 <= dev.sm_limit <= 100:
            raise LimitsFileError(f"device {i} ({dev.uuid}): memory_limit must be >= 0, sm_limit 1..100")
        lines += [
            f"device.{i}.uuid={dev.uuid}",
            f"device.{i}.memory_limit={dev.memory_limit}",
            f"device.{i}.sm_limit={dev.sm_limit}",
        ]
    lines.append(f"core_policy={limits.core_policy}")
    return "\n".join(lines) + "\n"


def parse_limits(text: str) -> Limits:
    """Parse the text format; raise LimitsFileError naming the bad line."""
    values: dict[str, str] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise LimitsFileError(f"line {no}: expected key=value, got {raw!r}")
        values[key.strip()] = value.strip()
    try:
        if int(values.get("version", "0")) != LIMITS_VERSION:
            raise LimitsFileError(f"version must be {LIMITS_VERSION}, got {values.get('version')!r}")
        count = int(values["devices"])
        devices = tuple(
            DeviceLimit(
                uuid=values[f"device.{i}.uuid"],
                memory_limit=int(values[f"device.{i}.memory_limit"]),
                sm_limit=int(values.get(f"device.{i}.sm_limit", "100")),
            )
            for i in range(count)
        )
    except KeyError as exc:
        raise LimitsFileError(f"missing key {exc.args[0]}") from None
    except ValueError as exc:
        if isinstance(exc, LimitsFileError):
            raise
        raise LimitsFileError(f"not a number: {exc}") from None
    limits = Limits(devices=devices, core_policy=values.get("core_policy", "default"))
    render_limits(limits)  # validates ranges
    return limits


def c_header() -> str:
    """The C header the shim includes: the same names and paths as this module."""
    out = [
        "/* Generated from devplugin/contract.py by `make contract`. Do not edit. */",
        "#ifndef GPUSHARE_CONTRACT_H",
        "#define GPUSHARE_CONTRACT_H",
        "",
    ]
    for name, value in sorted(globals().items()):
        if name.startswith(("ENV_", "CONTAINER_")) and isinstance(value, str):
            out.append(f'#define GS_{name} "{value}"')
    out += [
        f"#define GS_LIMITS_VERSION {LIMITS_VERSION}",
        f"#define GS_LIMITS_MAX_DEVICES {LIMITS_MAX_DEVICES}",
        "",
        "#endif /* GPUSHARE_CONTRACT_H */",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(c_header())
