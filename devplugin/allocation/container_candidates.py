"""Which container is the kubelet admitting? Resolved from the pods bound to this node. Pure: no I/O.

The kubelet's device-plugin calls carry no pod identity, only a resource and an amount. The container is the first
one, among pods on this node that have not finished, that asks for exactly this amount of this resource and is
not placed yet (by this daemon, or recorded on the pod by an earlier run of it), in the kubelet's order: pods in
the order they reached the node (the order the pod watch showed them bound here; a scheduler's assume time is not
it: binds run in parallel), then within a pod init containers, then app containers, each in spec order.

That is a guess when several containers ask alike (a burst): the allocator then takes the exact identity from the
kubelet's PodResources as soon as the kubelet lists the container (which_container.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from devplugin import contract as c
from devplugin.allocation.requests import ContainerRequest, PodRequest


def recorded_containers(pod: PodRequest) -> set[str]:
    """Container names the node daemon already recorded as placed on this pod. Only the daemon's own record counts:
    it names the pod's UID, which a pod created with a record of its own cannot know."""
    record = own_record(pod)
    return set(record.containers) if record is not None else set()


def own_record(pod: PodRequest) -> c.PodAssignment | None:
    """The node daemon's record on this pod (ANN_ALLOCATED naming the pod's UID), or None: absent, unreadable, or
    not written for this pod."""
    raw = pod.annotations.get(c.ANN_ALLOCATED)
    if not raw:
        return None
    try:
        record = c.parse_assignment(raw, c.ANN_ALLOCATED)
    except c.AnnotationError:
        return None
    return record if record.uid and record.uid == pod.uid else None


def candidates(pods: Iterable[PodRequest], resource: str, amount: int, taken: Set[tuple[str, str]],
               again: Set[tuple[str, str]] = frozenset()) -> list[tuple[PodRequest, ContainerRequest]]:
    """Every (pod, container) this call may be for, the kubelet's likeliest first. `resource` is the short name
    (gpu-mem, ...); `taken` holds (pod UID, container name) of containers already placed or refused; `again`,
    containers recorded on their pod that a restarted kubelet forgot and may admit again (a candidate although
    recorded)."""
    found: list[tuple[tuple, PodRequest, ContainerRequest]] = []
    for pod in pods:
        if pod.finished:
            continue
        recorded = None
        for container in pod.containers:
            if container.amount(resource) != amount or (pod.uid, container.name) in taken:
                continue
            if recorded is None:
                recorded = recorded_containers(pod)
            if container.name in recorded and (pod.uid, container.name) not in again:
                continue
            found.append(((pod.seen, pod.created, pod.uid, container.position), pod, container))
            break  # later containers of this pod come after this one in the kubelet's order
    found.sort(key=lambda t: t[0])
    return [(pod, container) for _, pod, container in found]


def find_container(pods: Iterable[PodRequest], resource: str, amount: int,
                   taken: Set[tuple[str, str]]) -> tuple[PodRequest, ContainerRequest] | None:
    """The likeliest (pod, container) this call is for, or None."""
    found = candidates(pods, resource, amount, taken)
    return found[0] if found else None


def next_app_container(pod: PodRequest, resource: str, amount: int,
                       taken: Set[tuple[str, str]], after: int = -1) -> ContainerRequest | None:
    """The container of `pod` that reuses an init container's devices: the first one after position `after` (the
    init container's), an app container or a sidecar (an init container with restartPolicy Always), not yet placed,
    that asks for `amount` of `resource`."""
    recorded = recorded_containers(pod)
    for container in pod.containers:
        if container.position <= after or (container.init and not container.sidecar):
            continue
        if container.amount(resource) != amount:
            continue
        if (pod.uid, container.name) in taken or container.name in recorded:
            continue
        return container
    return None
