"""A scheduler's GPU choice for a container, read from the pod's annotations (ours, ACK's, Alibaba's).

In order: our `gpushare.io/scheduled` (per container name), ACK's `scheduler.framework.gpushare.allocation`
(per app container index), Alibaba's `ALIYUN_COM_GPU_MEM_IDX` (one GPU index for the pod). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from devplugin import contract as c
from devplugin.allocation.node import Node
from devplugin.allocation.requests import ContainerRequest, PodRequest


@dataclass(frozen=True)
class Choice:
    """The GPUs a scheduler chose for a container, and where that was read."""

    gpus: tuple[str, ...]  # GPU UUIDs on this node
    source: str


def assume_time(pod: PodRequest) -> int | None:
    """When a scheduler decided on this pod (Unix ns), from any of the annotations that say so; None if none."""
    ann = pod.annotations
    raw = ann.get(c.ANN_SCHEDULED)
    if raw:
        try:
            return c.parse_assignment(raw).time_ns or None
        except c.AnnotationError:
            pass
    for name in (c.ANN_ACK_ASSUME_TIME, c.ANN_ALIYUN_ASSUME_TIME):
        value = ann.get(name)
        if value:
            try:
                return c.parse_assume_time(value, name)
            except c.AnnotationError:
                continue
    return None


def scheduler_choice(pod: PodRequest, container: ContainerRequest, node: Node) -> tuple[Choice | None, str]:
    """(the choice, "") or (None, why the annotations could not be used; "" when there are none)."""
    ann = pod.annotations
    by_index = {g.index: g.uuid for g in node.gpus}
    problems = []
    raw = ann.get(c.ANN_SCHEDULED)
    if raw:
        try:
            shares = c.parse_assignment(raw).containers.get(container.name)
        except c.AnnotationError as exc:
            problems.append(str(exc))
            shares = None
        if shares:
            uuids = []
            for s in shares:
                uuid = s.uuid if s.uuid in node.by_uuid else by_index.get(s.index)
                if uuid is None:
                    problems.append(f"{c.ANN_SCHEDULED} names GPU {s.index} ({s.uuid}), which this node lacks")
                    break
                uuids.append(uuid)
            else:
                return Choice(tuple(uuids), c.ANN_SCHEDULED), ""
    raw = ann.get(c.ANN_ACK_ALLOCATION)
    if raw and not container.init:
        try:
            per_gpu = c.parse_ack_allocation(raw).get(container.app_index)
        except c.AnnotationError as exc:
            problems.append(str(exc))
            per_gpu = None
        if per_gpu:
            missing = [i for i in per_gpu if i not in by_index]
            if not missing:
                return Choice(tuple(by_index[i] for i in sorted(per_gpu)), c.ANN_ACK_ALLOCATION), ""
            problems.append(f"{c.ANN_ACK_ALLOCATION} names GPU {missing[0]}, which this node lacks")
    raw = ann.get(c.ANN_ALIYUN_MEM_IDX)
    if raw is not None and raw != "" and container.mem:
        try:
            index: int | None = c.parse_gpu_index(raw)
        except c.AnnotationError:
            index = None
        if index in by_index:
            return Choice((by_index[index],), c.ANN_ALIYUN_MEM_IDX), ""
        problems.append(f"{c.ANN_ALIYUN_MEM_IDX}={raw[:40]!r} is not a GPU index of this node")
    return None, "; ".join(problems)
