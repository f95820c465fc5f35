"""Claims, GPUs and slices as the apiserver would hold them, for the DRA unit tests."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from devplugin import contract
from devplugin.gpu.device import GPU

GiB = 1 << 30
MiB = 1 << 20
NODE = "node-a"


def gpu(index: int, memory: int = 15 * GiB) -> GPU:
    return GPU(index=index, uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd", name="Tesla V100-SXM2-16GB",
               memory_bytes=memory, minor=index, pci_bus_id=f"00000000:{0x10 + index:02X}:00.0", numa_node=0)


GPUS = [gpu(0), gpu(1)]


def result(device: str, memory: str | None = "2Gi", cores: str | None = "30", request: str = "gpu",
           driver: str = contract.DRA_DRIVER, pool: str = NODE, share_id: str | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if not device.endswith("-whole"):
        r["shareID"] = share_id or str(uuidlib.uuid4())
        consumed = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
        r["consumedCapacity"] = consumed
    return r


def claim(uid: str, results: list[dict[str, Any]], name: str = "c1", ns: str = "team-a",
          reserved_for: list[str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": str(uuidlib.uuid4())} for p in reserved_for]
    return {"metadata": {"name": name, "namespace": ns, "uid": uid}, "status": status}
