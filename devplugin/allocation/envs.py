"""The env a container receives on Allocate, per resource. Keys that two resources both set carry equal values."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from devplugin import contract as c
from devplugin.allocation.decision import Decision
from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind, MiB


class MountLike(Protocol):
    @property
    def container_path(self) -> str: ...


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


def call_envs(node: Node, decision: Decision, kind: Kind, groups: Mapping[str, Collection[str]]) -> dict[str, str]:
    """The envs of one Allocate of a known container: what this call's device IDs say (its GPUs, and the amount of
    `kind` on each), never what the container's other resources are expected to bring. Keys both resources set
    name only the GPUs, so the kubelet's first-wins merge sees one value; and a call whose container is still a
    guess (several ask alike) tells nothing the guess could get wrong. Multi-GPU shares get one memory limit per
    device (HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i>), in the decision's GPU order."""
    gpus = [node.by_uuid[u] for u in decision.gpus]
    envs = {
        c.ENV_NVIDIA_VISIBLE_DEVICES: ",".join(g.uuid for g in gpus),
        c.ENV_ALIYUN_MEM_IDX: ",".join(str(g.index) for g in gpus),
    }
    if kind is Kind.COUNT:
        return envs
    envs[c.ENV_ALIYUN_MEM_DEV] = str(node.units(gpus[0].uuid, Kind.MEM))
    envs[c.ENV_ALIYUN_MEM_UNIT] = node.unit.name
    if kind is Kind.MEM:
        envs[c.ENV_ALIYUN_MEM_CONTAINER] = str(sum(len(ids) for ids in groups.values()))
        if node.isolates_memory():
            for i, gpu in enumerate(gpus):
                envs[f"{c.ENV_MEMORY_LIMIT}_{i}"] = f"{len(groups.get(gpu.uuid, ())) * node.unit.bytes // MiB}m"
        if decision.exact and node.isolates_compute() and Kind.CORE not in decision.request and decision.unreserved:
            envs[c.ENV_SM_LIMIT] = str(min(decision.unreserved.values()))  # compute nobody reserved (unreserved.py)
    elif kind is Kind.CORE and node.isolates_compute():
        envs[c.ENV_SM_LIMIT] = str(len(groups.get(gpus[0].uuid, ())))
    return envs


def decision_envs(node: Node, decision: Decision) -> dict[str, str]:
    """Every env of a container whose whole request is known: the same answer for each of its resources, so the
    kubelet's first-wins merge can never see two values for one key. Multi-GPU shares get one memory limit per
    device (HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i>)."""
    gpus = [node.by_uuid[u] for u in decision.gpus]
    envs = {
        c.ENV_NVIDIA_VISIBLE_DEVICES: ",".join(g.uuid for g in gpus),
        c.ENV_ALIYUN_MEM_IDX: ",".join(str(g.index) for g in gpus),
    }
    if Kind.COUNT in decision.request:
        return envs
    envs[c.ENV_ALIYUN_MEM_DEV] = str(node.units(gpus[0].uuid, Kind.MEM))
    envs[c.ENV_ALIYUN_MEM_UNIT] = node.unit.name
    mem = decision.per_gpu.get(Kind.MEM, 0)
    if Kind.MEM in decision.request:
        envs[c.ENV_ALIYUN_MEM_CONTAINER] = str(decision.request[Kind.MEM])
        if node.isolates_memory():
            for i in range(len(gpus)):
                envs[f"{c.ENV_MEMORY_LIMIT}_{i}"] = f"{mem * node.unit.bytes // MiB}m"
    core = decision.per_gpu.get(Kind.CORE, 0)
    if core and node.isolates_compute():
        envs[c.ENV_SM_LIMIT] = str(core)
    elif node.isolates_compute() and decision.unreserved:
        envs[c.ENV_SM_LIMIT] = str(min(decision.unreserved.values()))  # compute nobody reserved (unreserved.py)
    return envs


def shim_envs(envs: dict[str, str], mounts: Sequence[MountLike]) -> None:
    """With the shim's files mounted, the accounting file is named in HAMi-core's env too, so HAMi-core's
    libvgpu.so (when it is the library delivered) accounts in the container's own mounted file. Both of a
    container's resources get the same mounts, so the kubelet's merge sees one value."""
    if any(m.container_path == c.CONTAINER_SHARED_CACHE for m in mounts):
        envs[c.ENV_SHARED_CACHE] = c.CONTAINER_SHARED_CACHE
