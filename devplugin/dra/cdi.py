"""CDI specs (Container Device Interface) for prepared claims: one spec file per claim, one CDI device per request
of the claim (`<claim UID>-<request index>`), with the env and mounts that `devplugin serve` gives a shared
container. The container runtime reads `<cdi-dir>/gpushare.io-gpu_<claim UID>.json` when the kubelet names the
device `gpushare.io/gpu=<claim UID>-<index>`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from devplugin import contract
from devplugin.allocation.ports import MountSpec
from devplugin.atomic_file import write_atomically
from devplugin.deviceplugin.device_list import VOLUME_MOUNT_HOST_PATH, VOLUME_MOUNT_ROOT
from devplugin.dra.claims import GpuBudget

CDI_VERSION = "0.6.0"
_UID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
MiB = 1 << 20


def check_uid(uid: str) -> str:
    """A claim UID names files on the host: 1..63 of [a-z0-9-], else ValueError."""
    if not isinstance(uid, str) or not _UID.fullmatch(uid):
        raise ValueError(f"claim UID {uid!r} is not 1..63 characters of a-z, 0-9 and '-'")
    return uid


def device_id(name: str) -> str:
    """The fully qualified CDI device name the kubelet passes to the runtime."""
    return f"{contract.DRA_CDI_KIND}={name}"


def spec_path(cdi_dir: Path, uid: str) -> Path:
    vendor, cls = contract.DRA_CDI_KIND.split("/")
    return Path(cdi_dir) / f"{vendor}-{cls}_{check_uid(uid)}.json"


def claim_env(budgets: Sequence[GpuBudget], mounts: Sequence[MountSpec]) -> dict[str, str]:
    """The env serve gives a shared container: the GPUs (UUIDs, indexes), and with the shim HAMi-core's limits
    (per device memory in MiB, the compute share) and the accounting file."""
    env = {contract.ENV_NVIDIA_VISIBLE_DEVICES: ",".join(b.gpu.uuid for b in budgets),
           contract.ENV_ALIYUN_MEM_IDX: ",".join(str(b.gpu.index) for b in budgets)}
    if not mounts:
        return env
    for i, b in enumerate(budgets):
        if not b.whole:
            env[f"{contract.ENV_MEMORY_LIMIT}_{i}"] = f"{b.memory // MiB}m"
    shared = [b.cores for b in budgets if not b.whole]
    if shared and min(shared) < contract.CORE_PER_GPU:
        env[contract.ENV_SM_LIMIT] = str(min(shared))
    if any(m.container_path == contract.CONTAINER_SHARED_CACHE for m in mounts):
        env[contract.ENV_SHARED_CACHE] = contract.CONTAINER_SHARED_CACHE
    return env


def grant_mounts(budgets: Sequence[GpuBudget]) -> list[MountSpec]:
    """The GPUs granted the way NVIDIA's container toolkit reads a grant it trusts: `/dev/null` mounted at
    /var/run/nvidia-container-devices/<GPU UUID> (its volume-mounts device list). A node whose toolkit takes the
    grant from mounts (`accept-nvidia-visible-devices-as-volume-mounts = true` and the env of unprivileged
    containers ignored, docs/reference/security.md) gives the container exactly these GPUs; a toolkit of its
    defaults reads the same GPUs from NVIDIA_VISIBLE_DEVICES, which the device also sets."""
    return [MountSpec(f"{VOLUME_MOUNT_ROOT}/{b.gpu.uuid}", VOLUME_MOUNT_HOST_PATH, True) for b in budgets]


def device_spec(name: str, budgets: Sequence[GpuBudget], mounts: Sequence[MountSpec]) -> dict[str, object]:
    """One CDI device: the env and mounts of one request of a claim, and its GPUs' grant by mounts."""
    env = claim_env(budgets, mounts)
    edits: dict[str, object] = {"env": [f"{k}={v}" for k, v in env.items()]}
    edits["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                        "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]}
                       for m in [*mounts, *grant_mounts(budgets)]]
    return {"name": name, "containerEdits": edits}


def build_spec(devices: Sequence[dict[str, object]]) -> dict[str, object]:
    """The CDI spec of one claim: a device per request."""
    return {"cdiVersion": CDI_VERSION, "kind": contract.DRA_CDI_KIND, "devices": list(devices)}


def write_spec(path: Path, spec: dict[str, object]) -> None:
    """Write atomically (temporary file, fsync, rename): the runtime never reads half a spec."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(spec, indent=1), mode=0o644)


def remove_spec(path: Path) -> None:
    path.unlink(missing_ok=True)
