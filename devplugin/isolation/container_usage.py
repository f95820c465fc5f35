"""Per-container GPU use beside allocation: the containers the daemon knows as holding devices (the allocator's
holdings, so a container that ended is gone as soon as the daemon knows it ended), each read from its own usage
file (usage_file.py). Read at scrape time; bounded by the node's containers times their GPUs (at most 16 each).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devplugin.allocation.holdings import Holding
from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind
from devplugin.isolation.shim_files import ShimPaths, usage_file_path
from devplugin.isolation.usage_file import GpuFigures, read_usage_file


@dataclass(frozen=True)
class ContainerGpuUse:
    """One container on one GPU: what it was given, and what it uses."""

    namespace: str
    pod: str
    container: str
    gpu: int  # GPU index on the node
    uuid: str
    memory_limit: int  # bytes given (a GPU held whole: all of its memory)
    compute_share: int  # percent of the GPU given (100: no compute limit)
    memory_used: int  # bytes its live processes charged
    compute_used: int | None  # percent of the GPU's time at the last measurement (None: not measured)
    refused: int  # allocations refused at the cap
    throttled_s: float  # time its launches waited for the compute share
    processes: int  # processes of the container registered in its usage file
    error: str = ""  # why its usage file could not be read ("" when it could, or there is none yet)


def container_use(node: Node, holdings: Iterable[Holding], paths: ShimPaths) -> list[ContainerGpuUse]:
    """Every held (container, GPU), with its figures; sorted by GPU, namespace, pod, container."""
    by_uuid = {g.uuid.lower(): g for g in node.gpus}
    unit_bytes = node.unit.bytes
    rows = []
    for h in holdings:
        gpus = sorted(h.gpus(), key=lambda u: by_uuid[u.lower()].index if u.lower() in by_uuid else 1 << 30)
        gpus = [u for u in gpus if u.lower() in by_uuid]
        if not gpus:
            continue
        biggest = max(by_uuid[u.lower()].memory_bytes for u in gpus)
        usage = read_usage_file(_usage_path(str(paths.host_root), h.holder), biggest)
        key = h.key
        namespace, pod = (key.namespace, key.pod) if key else ("", "")
        container = key.container if key else h.holder
        for uuid in gpus:
            gpu = by_uuid[uuid.lower()]
            whole = uuid in h.ids.get(Kind.COUNT, {})
            mem_units = len(h.ids.get(Kind.MEM, {}).get(uuid, ()))
            core = len(h.ids.get(Kind.CORE, {}).get(uuid, ()))
            figures = usage.gpus.get(uuid.lower())
            rows.append(ContainerGpuUse(
                namespace=namespace, pod=pod, container=container, gpu=gpu.index, uuid=gpu.uuid,
                memory_limit=gpu.memory_bytes if whole else mem_units * unit_bytes,
                compute_share=100 if whole or not core else core,
                memory_used=min(figures.memory_used, gpu.memory_bytes) if figures else 0,
                compute_used=_compute_used(figures, usage.error, core if core and not whole else 100),
                refused=figures.refused if figures else 0,
                throttled_s=figures.throttled_s if figures else 0.0,
                processes=usage.processes, error=usage.error))
    rows.sort(key=lambda r: (r.gpu, r.namespace, r.pod, r.container))
    return rows


@functools.lru_cache(maxsize=4096)
def _usage_path(host_root: str, holder: str) -> str:
    """usage_file_path as a string, once per container (a scrape reads every container's file)."""
    return str(usage_file_path(ShimPaths(host_root=Path(host_root)), holder))


def _compute_used(figures: GpuFigures | None, error: str, share: int) -> int | None:
    """The shim measures a container's compute only where it holds a share (below 100 %)."""
    if share >= 100 or error:
        return None
    return figures.compute_used if figures else 0
