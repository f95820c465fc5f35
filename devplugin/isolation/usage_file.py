"""Reading one container's usage file (the shim's accounting, `contract.USAGE_*`) for the node daemon's metrics.

The container writes this file itself, so nothing in it is trusted beyond the figures it holds for that
container: the file is opened read-only without following a symbolic link and without blocking (a FIFO or a
device is refused, not read), at most `contract.USAGE_FILE_SIZE` bytes are read, counts and indices are clamped
to the layout's bounds, and every figure is clamped to a range the caller gives (a GPU's memory, 0..100 percent).
A file that does not parse gives a reason, never an exception: the daemon's health never depends on it.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from devplugin import contract as c

_HEADER = struct.Struct("<QIII")  # magic, version, ndevices, nslots
_SLOT = struct.Struct(f"<i{c.USAGE_SLOT_USED - 4}x{c.USAGE_DEVICES}Q")  # pid, (reserved, start time), used[]
_STATS = struct.Struct("<QQQ")  # refused, refused_bytes, throttled_ns
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
COUNT_MAX = 1 << 53  # counters beyond this are garbage (and would lose precision as Prometheus floats)
THROTTLED_NS_MAX = 10**9 * 86400 * 366 * 100  # a century


@dataclass(frozen=True)
class GpuFigures:
    """What the usage file says about one GPU of the container."""

    memory_used: int = 0  # bytes charged by the container's live processes
    refused: int = 0  # allocations refused at the cap
    throttled_s: float = 0.0  # time launches waited for the compute share
    compute_used: int | None = None  # percent of the GPU's time at the last measurement; None: not measured


@dataclass(frozen=True)
class UsageFile:
    """One container's usage file, read: per GPU UUID (lower case), and the processes registered."""

    gpus: dict[str, GpuFigures] = field(default_factory=dict)
    processes: int = 0
    error: str = ""  # why the file could not be read ("" when it was, or when there is none yet)


def read_usage_file(path: str | Path, memory_max: int) -> UsageFile:
    """The figures of the file at `path`; an empty UsageFile when there is none (the container has not used CUDA
    yet), one with `error` set when it cannot be trusted. `memory_max` clamps memory figures (the GPU's size)."""
    try:
        data = _read_bounded(path)
    except FileNotFoundError:
        return UsageFile()
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        return UsageFile(error=f"cannot open {os.path.basename(path)}: {why}")
    except ValueError as exc:
        return UsageFile(error=str(exc))
    return parse_usage(data, memory_max)


def _read_bounded(path: str | Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{os.path.basename(path)} is not a plain file")
        return os.pread(fd, c.USAGE_FILE_SIZE, 0)
    finally:
        os.close(fd)


def parse_usage(data: bytes, memory_max: int) -> UsageFile:
    """The figures in a usage file's bytes (see read_usage_file)."""
    if len(data) < c.USAGE_FILE_SIZE:
        return UsageFile(error=f"{len(data)} bytes, a version {c.USAGE_VERSION} usage file has {c.USAGE_FILE_SIZE}")
    magic, version, ndevices, nslots = _HEADER.unpack_from(data, 0)
    if magic == 0 and version == 0:
        return UsageFile()  # made by the daemon, not yet mapped by the shim: the container has not used CUDA
    if magic != c.USAGE_MAGIC or version != c.USAGE_VERSION:
        return UsageFile(error=f"not a version {c.USAGE_VERSION} usage file (magic {magic:#x}, version {version})")
    ndevices, nslots = min(ndevices, c.USAGE_DEVICES), min(nslots, c.USAGE_SLOTS)
    used = [0] * ndevices
    processes = 0
    for i in range(nslots):
        pid, *per_gpu = _SLOT.unpack_from(data, c.USAGE_OFF_SLOTS + i * c.USAGE_SLOT_SIZE)
        if pid <= 0:
            continue
        processes += 1
        for d in range(ndevices):
            used[d] += per_gpu[d]
    gpus: dict[str, GpuFigures] = {}
    for d in range(ndevices):
        uuid = _uuid(data, c.USAGE_OFF_DEVICES + d * c.USAGE_DEVICE_SIZE)
        if not uuid or uuid in gpus:
            continue
        refused, _, throttled_ns = _STATS.unpack_from(data, c.USAGE_OFF_STATS + d * c.USAGE_STATS_SIZE)
        gpus[uuid] = GpuFigures(memory_used=min(used[d], memory_max), refused=min(refused, COUNT_MAX),
                                throttled_s=min(throttled_ns, THROTTLED_NS_MAX) / 1e9,
                                compute_used=_compute_used(data, c.USAGE_OFF_COMPUTE + d * c.USAGE_COMPUTE_SIZE))
    return UsageFile(gpus=gpus, processes=processes)


def _uuid(data: bytes, offset: int) -> str:
    raw = data[offset:offset + c.USAGE_UUID_LEN].split(b"\0", 1)[0]
    try:
        return raw.decode("ascii").lower()
    except UnicodeDecodeError:
        return ""


def _compute_used(data: bytes, offset: int) -> int | None:
    """Percent of the GPU's time the container's launches took at the last control step; 0 when it never
    launched; None when it launched but no step has measured it yet."""
    steps = _I32.unpack_from(data, offset + c.USAGE_COMPUTE_STEPS)[0]
    if steps > 0:
        pct = _I32.unpack_from(data, offset + c.USAGE_COMPUTE_USED_PCT)[0]
        return max(0, min(pct, 100)) if pct >= 0 else None
    spent = _U64.unpack_from(data, offset + c.USAGE_COMPUTE_SPENT)[0]
    return 0 if spent == 0 else None
