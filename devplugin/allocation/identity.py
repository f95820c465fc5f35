"""Which container is the kubelet admitting? Resolved from the pods bound to this node. Pure: no I/O.

The kubelet's device-plugin calls carry no pod identity, only a resource and an amount. The container is the first
one, among pods on this node that have not finished, that asks for exactly this amount of this resource and is
not placed yet (by this daemon, or recorded on the pod by an earlier run of it), in this order: pods a scheduler
decided on first (by assume time), then the oldest (ties: the order the pod cache saw them bound); within a pod,
the kubelet's own order (init containers, then app containers, each in spec order).
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from devplugin import contract as c
from devplugin.allocation.choice import assume_time
from devplugin.allocation.requests import ContainerRequest, PodRequest


def recorded_containers(pod: PodRequest) -> set[str]:
    """Container names the node daemon already recorded as placed on this pod."""
    raw = pod.annotations.get(c.ANN_ALLOCATED)
    if not raw:
        return set()
    try:
        return set(c.parse_assignment(raw, c.ANN_ALLOCATED).containers)
    except c.AnnotationError:
        return set()


def find_container(pods: Iterable[PodRequest], resource: str, amount: int,
                   taken: Set[tuple[str, str]]) -> tuple[PodRequest, ContainerRequest] | None:
    """The (pod, container) this call is for, or None. `resource` is the short name (gpu-mem, ...); `taken`
    holds (pod UID, container name) of containers already placed or refused."""
    best: tuple[tuple, PodRequest, ContainerRequest] | None = None
    for pod in pods:
        if pod.finished:
            continue
        recorded = None
        for container in pod.containers:
            if container.amount(resource) != amount or (pod.uid, container.name) in taken:
                continue
            if recorded is None:
                recorded = recorded_containers(pod)
            if container.name in recorded:
                continue
            assumed = assume_time(pod)
            rank = (assumed is None, assumed or 0, pod.created, pod.seen, pod.uid, container.position)
            if best is None or rank < best[0]:
                best = (rank, pod, container)
            break  # later containers of this pod come after this one in the kubelet's order
    return (best[1], best[2]) if best else None


def next_app_container(pod: PodRequest, resource: str, amount: int,
                       taken: Set[tuple[str, str]]) -> ContainerRequest | None:
    """The app container of `pod` that reuses an init container's devices: the first one not yet placed that asks
    for `amount` of `resource`."""
    recorded = recorded_containers(pod)
    for container in pod.containers:
        if container.init or container.amount(resource) != amount:
            continue
        if (pod.uid, container.name) in taken or container.name in recorded:
            continue
        return container
    return None
