"""The env a container receives on Allocate, per resource. Keys that two resources both set carry equal values."""

from __future__ import annotations

from devplugin import contract as c
from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind, MiB


def container_envs(node: Node, kind: Kind, uuids: tuple[str, ...], amount: int) -> dict[str, str]:
    """Envs for `amount` units of `kind` on these GPUs (one GPU unless gpu-count)."""
    gpus = [node.by_uuid[u] for u in uuids]
    envs = {
        c.ENV_NVIDIA_VISIBLE_DEVICES: ",".join(g.uuid for g in gpus),
        c.ENV_ALIYUN_MEM_IDX: ",".join(str(g.index) for g in gpus),
    }
    if kind is Kind.COUNT:
        return envs
    gpu = gpus[0]
    envs[c.ENV_ALIYUN_MEM_DEV] = str(node.units(gpu.uuid, Kind.MEM))
    envs[c.ENV_ALIYUN_MEM_UNIT] = node.unit.name
    if kind is Kind.MEM:
        envs[c.ENV_ALIYUN_MEM_CONTAINER] = str(amount)
        if node.isolates_memory():
            envs[f"{c.ENV_MEMORY_LIMIT}_0"] = f"{amount * node.unit.bytes // MiB}m"
    elif kind is Kind.CORE and node.isolates_compute():
        envs[c.ENV_SM_LIMIT] = str(amount)
    return envs
