"""Delivering the isolation shim to a container: the host files the daemon writes and the mounts Allocate returns.

Per container (alloc_id), under `<host_root>/containers/<alloc_id>/`:
    limits   the read-only limits file (contract.render_limits), replaced atomically
    state/   the container's accounting directory (the shim's shared usage file lives here)
and once per node `<host_root>/ld.so.preload`, naming the library's path inside the container.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from devplugin import contract
from devplugin.allocation.allocator import MountSpec

log = logging.getLogger(__name__)

ALLOC_ID = re.compile(r"[a-z0-9-]{1,63}")
CONTAINERS = "containers"
LIMITS = "limits"
STATE = "state"
PRELOAD = "ld.so.preload"


@dataclass(frozen=True)
class ShimPaths:
    """Where the shim's files live on the host."""

    host_root: Path = Path("/var/run/gpushare")
    host_lib: Path = Path("/usr/local/gpushare/lib/libgpushare.so")  # installed by the DaemonSet


def check_alloc_id(alloc_id: str) -> str:
    """Return alloc_id if it is 1..63 of [a-z0-9-]; else ValueError (it names a host directory)."""
    if not isinstance(alloc_id, str) or not ALLOC_ID.fullmatch(alloc_id):
        raise ValueError(
            f"alloc_id {alloc_id!r} is not 1..63 characters of a-z, 0-9 and '-'; "
            "it names a directory on the host, so nothing else is accepted"
        )
    return alloc_id


def container_dir(paths: ShimPaths, alloc_id: str) -> Path:
    return Path(paths.host_root) / CONTAINERS / check_alloc_id(alloc_id)


def _write_atomically(path: Path, text: str, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def merge_limits(old: contract.Limits, new: contract.Limits) -> contract.Limits:
    """One container's limits from two Allocate calls (gpu-mem, then gpu-core.percentage): per GPU UUID, a value
    the new limits leave at its default (memory 0, sm 100; policy "default") keeps the earlier one."""
    devices = {d.uuid: d for d in old.devices}
    for d in new.devices:
        before = devices.get(d.uuid)
        if before is None:
            devices[d.uuid] = d
            continue
        devices[d.uuid] = replace(
            before,
            memory_limit=d.memory_limit or before.memory_limit,
            sm_limit=d.sm_limit if d.sm_limit != 100 else before.sm_limit,
        )
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


def _write_preload(paths: ShimPaths) -> Path:
    preload = Path(paths.host_root) / PRELOAD
    text = contract.CONTAINER_LIB_PATH + "\n"
    try:
        if preload.read_text() == text:
            return preload
    except FileNotFoundError:
        pass
    _write_atomically(preload, text, 0o444)
    return preload


def prepare_container(paths: ShimPaths, alloc_id: str, limits: contract.Limits) -> list[MountSpec]:
    """Write the container's limits file and accounting directory; return the mounts that deliver the shim.

    Calling it again for the same alloc_id merges the limits into the file (see merge_limits) and returns the
    same mounts. ValueError for a bad alloc_id or limits the file format cannot hold.
    """
    cdir = container_dir(paths, alloc_id)
    cdir.mkdir(parents=True, exist_ok=True)
    state = cdir / STATE
    state.mkdir(exist_ok=True)
    os.chmod(state, 0o777)  # the container's processes may run as any user
    limits_path = cdir / LIMITS
    earlier = _read_limits(limits_path)
    merged = merge_limits(earlier, limits) if earlier else limits
    _write_atomically(limits_path, contract.render_limits(merged), 0o444)
    preload = _write_preload(paths)
    log.info("shim for container %s: %s", alloc_id,
             ", ".join(f"{d.uuid} memory {d.memory_limit} bytes, sm {d.sm_limit}%" for d in merged.devices))
    return [
        MountSpec(contract.CONTAINER_LIB_PATH, str(paths.host_lib), True),
        MountSpec(contract.CONTAINER_PRELOAD_PATH, str(preload), True),
        MountSpec(contract.CONTAINER_LIMITS_PATH, str(limits_path), True),
        MountSpec(contract.CONTAINER_STATE_DIR, str(state), False),
    ]


def cleanup(paths: ShimPaths, live_alloc_ids: set[str], min_age_s: float = 0.0) -> list[str]:
    """Remove the directories of containers not in live_alloc_ids; return their alloc_ids, sorted.
    Entries that are not alloc_id directories, and directories changed less than min_age_s ago (a container
    still starting may not be listed yet), are left alone."""
    root = Path(paths.host_root) / CONTAINERS
    removed = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    young = time.time() - min_age_s
    for entry in entries:
        if not ALLOC_ID.fullmatch(entry.name) or entry.name in live_alloc_ids or not entry.is_dir():
            continue
        if min_age_s and entry.lstat().st_mtime > young:
            continue
        if entry.is_symlink():
            entry.unlink()
        else:
            shutil.rmtree(entry)
        removed.append(entry.name)
        log.info("removed the shim files of ended container %s", entry.name)
    return sorted(removed)
