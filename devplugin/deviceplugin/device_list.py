"""How a container is told which GPUs it may use: the device-list strategy of NVIDIA's container toolkit.

- `envvar`: NVIDIA_VISIBLE_DEVICES=<GPU UUIDs>. Simple, but an env is something a pod can write too (by `env`,
  `envFrom` or its image); only the admission webhook stands between a tenant and `all`.
- `volume-mounts`: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices and one mount per GPU,
  /dev/null -> /var/run/nvidia-container-devices/<GPU UUID>. A pod cannot create mounts by itself, so with the
  toolkit's `accept-nvidia-visible-devices-as-volume-mounts = true` and
  `accept-nvidia-visible-devices-envvar-when-unprivileged = false`, an env a pod sets grants nothing.
- `cdi-cri`: CDI device names (`nvidia.com/gpu=<GPU UUID>`) in the AllocateResponse; the runtime injects exactly
  those devices. NVIDIA_VISIBLE_DEVICES is set to `void` so that a legacy hook injects nothing more.

Pure: the servicer applies it to every AllocateResponse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devplugin.allocation.ports import MountSpec
from devplugin.contract import ENV_NVIDIA_VISIBLE_DEVICES

STRATEGIES = ("envvar", "volume-mounts", "cdi-cri")
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNT_HOST_PATH = "/dev/null"  # what NVIDIA's device plugin mounts: the path's name is the grant
CDI_KIND = "nvidia.com/gpu"


@dataclass(frozen=True)
class DeviceList:
    """What an AllocateResponse carries to name a container's GPUs."""

    envs: dict[str, str]
    mounts: tuple[MountSpec, ...] = ()
    cdi_devices: tuple[str, ...] = ()


def device_list(strategy: str, gpus: Sequence[str], envs: Mapping[str, str],
                mounts: Sequence[MountSpec] = ()) -> DeviceList:
    """The grant of `gpus` (UUIDs) by `strategy`, on top of the daemon's other envs and mounts."""
    if strategy not in STRATEGIES:
        raise ValueError(f"device-list strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    out = dict(envs)
    if strategy == "envvar":
        return DeviceList(out, tuple(mounts))
    if strategy == "volume-mounts":
        out[ENV_NVIDIA_VISIBLE_DEVICES] = VOLUME_MOUNT_ROOT
        granted = tuple(MountSpec(f"{VOLUME_MOUNT_ROOT}/{uuid}", VOLUME_MOUNT_HOST_PATH, True) for uuid in gpus)
        return DeviceList(out, tuple(mounts) + granted)
    out[ENV_NVIDIA_VISIBLE_DEVICES] = "void"
    return DeviceList(out, tuple(mounts), tuple(f"{CDI_KIND}={uuid}" for uuid in gpus))
