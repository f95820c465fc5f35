"""A container's request as the allocator serves it: its whole amounts, the units of each on each of its GPUs, and
what it needs of a GPU to be placed there (container_placement.Need). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from devplugin.allocation.container_placement import Need
from devplugin.allocation.decision import key_of
from devplugin.allocation.errors import RequestError
from devplugin.allocation.node import Node
from devplugin.allocation.requests import ContainerRequest, PodRequest, PodRequestError, check_core, per_gpu_share
from devplugin.allocation.units import Kind
from devplugin.allocation.unreserved import MIN_UNRESERVED, reserves_none


@dataclass(frozen=True)
class Asked:
    request: dict[Kind, int]  # whole-container amounts (the kubelet's sizes)
    per_gpu: dict[Kind, int]  # units of each on each of its GPUs
    gpus: int  # how many GPUs


def asked(node: Node, pod: PodRequest, container: ContainerRequest) -> Asked:
    """What the container asks of this node; RequestError for what cannot be served."""
    what = f"container {key_of(pod, container)}"
    if container.count and (container.mem or container.core):
        raise RequestError(f"{what} asks for gpu-count together with gpu-mem / gpu-core.percentage: ask for "
                           "whole GPUs (gpu-count) alone, or share N GPUs with the pod label "
                           "aliyun.com/gpu-count: \"N\" and gpu-mem only", reason="count_with_share")
    gpus = container.count or (pod.gpus_per_container if (container.mem or container.core) else 1)
    try:
        mem, core = per_gpu_share(container, gpus) if not container.count else (0, 0)
    except PodRequestError as exc:
        raise RequestError(f"pod {pod.key}: {exc}", reason="pod_request") from None
    if container.core and Kind.CORE in node.kinds:
        problem = check_core(container.core, gpus)
        if problem:
            raise RequestError(f"{what}: {problem}", reason="core_share")
    request = {k: n for k, n in ((Kind.MEM, container.mem), (Kind.CORE, container.core),
                                 (Kind.COUNT, container.count)) if n and k in node.kinds}
    per_gpu = {Kind.MEM: mem, Kind.CORE: core if Kind.CORE in node.kinds else 0}
    return Asked(request, {k: (1 if k is Kind.COUNT else per_gpu[k]) for k in request}, gpus)


def need_of(node: Node, per_gpu: Mapping[Kind, int], gpus: int, container: ContainerRequest) -> Need:
    """What a container needs on each of its GPUs, a container that reserves no compute on a core_mem node
    included (some compute nobody reserved: unreserved.py)."""
    shares: dict[Kind, int] = {k: n for k, n in per_gpu.items() if n and k is not Kind.COUNT}
    unpaid = not container.count and reserves_none(node.mode, shares.get(Kind.MEM, 0), shares.get(Kind.CORE, 0))
    return Need(per_gpu=shares, gpus=gpus, whole=bool(container.count),
                unreserved=MIN_UNRESERVED if unpaid else 0)
