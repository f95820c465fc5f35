"""Delivering the isolation shim to a container: the host files the daemon writes and the mounts Allocate returns.

Per container, under `<host_root>/containers/<name>/` (name: `<pod UID>-<container name>`, or `anon-<random>`
when the daemon could not name the container; a new container always starts from a fresh directory):
    limits   the read-only limits file (contract.render_limits), replaced atomically
    owner    JSON: the pod and container, and the device IDs they hold (the janitor matches it to PodResources)
    state/usage.cache   the container's accounting file (the shim maps it), made at its size by the daemon and
             mounted alone: the container gets no writable host directory
and once per node `<host_root>/ld.so.preload`, naming the library's path inside the container, and
`<host_root>/gpu-locks/<GPU UUID>.lock` (read-only, shared by every container: the shim's node-wide lock while a
process finds its NVML pid).
`<host_root>/containers` is root-only (0700): a host user cannot reach a container's files; the container reaches
only its own, through its mounts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from devplugin import contract
from devplugin.allocation.ports import MountSpec
from devplugin.atomic_file import write_atomically

log = logging.getLogger(__name__)

ALLOC_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")  # <pod UID (36)>-<container name (up to 63)>
CONTAINERS = "containers"
LIMITS = "limits"
STATE = "state"
PRELOAD = "ld.so.preload"
GPU_LOCKS = "gpu-locks"


@dataclass(frozen=True)
class Owner:
    """Who a container directory belongs to."""

    devices: tuple[str, ...] = ()
    pod_uid: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""


OWNER = "owner"


@dataclass(frozen=True)
class ShimPaths:
    """Where the shim's files live on the host."""

    host_root: Path = Path("/var/run/gpushare")
    host_lib: Path = Path("/usr/local/gpushare/lib/libgpushare.so")  # installed by the DaemonSet


def check_alloc_id(alloc_id: str) -> str:
    """Return alloc_id if it is 1..100 of [a-z0-9-], not starting with '-'; else ValueError (it names a host
    directory)."""
    if not isinstance(alloc_id, str) or not ALLOC_ID.fullmatch(alloc_id):
        raise ValueError(
            f"alloc_id {alloc_id!r} is not 1..100 characters of a-z, 0-9 and '-'; "
            "it names a directory on the host, so nothing else is accepted"
        )
    return alloc_id


def container_dir(paths: ShimPaths, alloc_id: str) -> Path:
    return Path(paths.host_root) / CONTAINERS / check_alloc_id(alloc_id)


def usage_file_path(paths: ShimPaths, alloc_id: str) -> Path:
    """Where the container's shim keeps its usage file (contract.CONTAINER_SHARED_CACHE), seen from the host."""
    return container_dir(paths, alloc_id) / STATE / Path(contract.CONTAINER_SHARED_CACHE).name


def merge_limits(old: contract.Limits, new: contract.Limits) -> contract.Limits:
    """One container's limits from two Allocate calls (gpu-mem, then gpu-core.percentage): per GPU UUID, a value
    the new limits leave at its default (memory 0, sm 100; policy "default") keeps the earlier one. A compute share
    (sm_limit below 100, reserved) wins over no reservation (sm_unreserved), whichever call brought it: the
    gpu-mem call of a container placed without its pod cannot know that its gpu-core.percentage call follows."""
    devices = {d.uuid: d for d in old.devices}
    for d in new.devices:
        before = devices.get(d.uuid)
        if before is None:
            devices[d.uuid] = d
            continue
        paid_before = before.sm_limit != 100 and not before.sm_unreserved
        if d.sm_limit != 100 and not d.sm_unreserved:
            sm, unreserved = d.sm_limit, False
        elif paid_before or not d.sm_unreserved:
            sm, unreserved = before.sm_limit, before.sm_unreserved
        else:
            sm, unreserved = d.sm_limit, True
        devices[d.uuid] = replace(before, memory_limit=d.memory_limit or before.memory_limit, sm_limit=sm,
                                  sm_unreserved=unreserved)
    policy = new.core_policy if new.core_policy != "default" else old.core_policy
    return contract.Limits(devices=tuple(devices.values()), core_policy=policy)


def _read_limits(path: Path) -> contract.Limits | None:
    try:
        return contract.parse_limits(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, contract.LimitsFileError) as exc:
        log.warning("replacing the unreadable limits file %s: %s", path, exc)
        return None


def _gpu_locks(paths: ShimPaths, uuids: list[str]) -> Path:
    """The node's per-GPU lock files (empty, read-only: flock needs no write access), shared by every container so
    that processes starting on one GPU at the same moment take turns to find their NVML pid."""
    root = Path(paths.host_root) / GPU_LOCKS
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    for uuid in uuids:
        lock = root / f"{uuid}.lock"
        if not lock.exists():
            fd = os.open(lock, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o444)
            os.close(fd)
    return root


def _write_preload(paths: ShimPaths) -> Path:
    preload = Path(paths.host_root) / PRELOAD
    text = contract.CONTAINER_LIB_PATH + "\n"
    try:
        if preload.read_text() == text:
            return preload
    except FileNotFoundError:
        pass
    write_atomically(preload, text, 0o444)
    return preload


def prepare_container(paths: ShimPaths, alloc_id: str, limits: contract.Limits, owner: Owner | None = None,
                      fresh: bool = False) -> list[MountSpec]:
    """Write the container's limits file and accounting directory; return the mounts that deliver the shim.

    `fresh`: the container's first Allocate: whatever an earlier container left under this name is removed
    first. Calling it again for the same alloc_id merges the limits into the file (see merge_limits) and returns
    the same mounts. ValueError for a bad alloc_id or limits the file format cannot hold; OSError when the host
    directory cannot be written.
    """
    contract.render_limits(limits)  # refuse what the file cannot hold before touching the disk
    cdir = container_dir(paths, alloc_id)
    root = cdir.parent
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    if fresh and (cdir.exists() or cdir.is_symlink()):
        if cdir.is_symlink() or not cdir.is_dir():
            cdir.unlink()
        else:
            shutil.rmtree(cdir)
    cdir.mkdir(exist_ok=True)
    if owner is not None:
        write_atomically(cdir / OWNER, json.dumps(asdict(owner)), 0o444)
    state = cdir / STATE
    state.mkdir(exist_ok=True)
    os.chmod(state, 0o700)
    usage = _usage_file(state / Path(contract.CONTAINER_SHARED_CACHE).name)
    limits_path = cdir / LIMITS
    earlier = _read_limits(limits_path)
    merged = merge_limits(earlier, limits) if earlier else limits
    write_atomically(limits_path, contract.render_limits(merged), 0o444)
    preload = _write_preload(paths)
    locks = _gpu_locks(paths, [d.uuid for d in limits.devices])
    log.info("shim for container %s: %s", alloc_id,
             ", ".join(f"{d.uuid} memory {d.memory_limit} bytes, sm {d.sm_limit}%"
                       + (" of compute nobody reserved" if d.sm_unreserved else "") for d in merged.devices))
    return [
        MountSpec(contract.CONTAINER_LIB_PATH, str(paths.host_lib), True),
        MountSpec(contract.CONTAINER_PRELOAD_PATH, str(preload), True),
        MountSpec(contract.CONTAINER_LIMITS_PATH, str(limits_path), True),
        # The container's own accounting file, and nothing else writable: no directory in which to make files,
        # links or fill the host's /var/run.
        MountSpec(contract.CONTAINER_SHARED_CACHE, str(usage), False),
        MountSpec(contract.CONTAINER_GPU_LOCK_DIR, str(locks), True),
    ]


def _usage_file(path: Path) -> Path:
    """The container's accounting file, made at the size the shim maps (contract.USAGE_FILE_SIZE), writable by any
    user of the container (its processes may run as any uid; the pod spec's runAsUser does not reach the daemon)
    and reachable by no one else: its directory is root-only and the file is mounted into this container alone.
    Kept as it is when it exists (a second Allocate of the same container: its processes may be using it)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise OSError(f"{path} is not a plain file; remove it")
    if not path.exists():
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, contract.USAGE_FILE_SIZE)
            os.fchmod(fd, 0o666)
        finally:
            os.close(fd)
    return path


def _owner_devices(cdir: Path) -> set[str] | None:
    try:
        return set(json.loads((cdir / OWNER).read_text()).get("devices") or ())
    except (OSError, ValueError, AttributeError):
        return None


def cleanup(paths: ShimPaths, live_devices: set[str], min_age_s: float = 0.0) -> list[str]:
    """Remove the directories of containers that hold none of `live_devices` (every device ID the kubelet lists
    as held); return their names, sorted. Entries that are not container directories, and directories changed
    less than min_age_s ago (a container still starting may not be listed yet), are left alone."""
    root = Path(paths.host_root) / CONTAINERS
    removed = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    young = time.time() - min_age_s
    for entry in entries:
        if not ALLOC_ID.fullmatch(entry.name) or not (entry.is_dir() or entry.is_symlink()):
            continue
        if min_age_s and entry.lstat().st_mtime > young:
            continue
        if entry.is_symlink():
            entry.unlink()
        else:
            devices = _owner_devices(entry)
            if devices and devices & live_devices:
                continue
            shutil.rmtree(entry)
        removed.append(entry.name)
        log.info("removed the shim files of ended container %s", entry.name)
    return sorted(removed)
