"""Which GPUs a pod holds, read from its annotations (ours first, then ACK's and Alibaba's): steering only.

A pod's annotations can say which GPUs its own containers are on, never how much they take: `bounded` keeps, for
each GPU container of the pod, at most as many GPUs as it asks for and gives each the amounts of its own request
(whole GPUs for gpu-count). A pod that asks for no GPU holds nothing whatever its annotations say; a negative or
oversized amount cannot cancel or block room.

Each container counts from ANN_ALLOCATED (what the node daemon placed) once that record names it; until then
from the scheduler's choice: ANN_SCHEDULED (the extender's), ACK's `scheduler.framework.gpushare.allocation`
(+ its core-percentage twin), Alibaba's `ALIYUN_COM_GPU_MEM_IDX` with the pod's own gpu-mem and core asks. The
daemon writes ANN_ALLOCATED container by container, so a pod is read container by container: its other
containers are not forgotten while the first one's record is written. An unreadable annotation is skipped
(logged) for the next source. Init containers count only while the pod is Pending: once it runs they are done.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from devplugin.allocation.requests import PodRequest, PodRequestError, per_gpu_share
from devplugin.contract import (
    ANN_ACK_ALLOCATION,
    ANN_ACK_CORE_ALLOCATION,
    ANN_ALIYUN_MEM_IDX,
    ANN_ALLOCATED,
    ANN_SCHEDULED,
    AnnotationError,
    GpuShare,
    parse_ack_allocation,
    parse_assignment,
    parse_gpu_index,
)

log = logging.getLogger(__name__)

Holding = Mapping[str, tuple[GpuShare, ...]]  # container name -> its GPU shares


def pod_holding(pod: PodRequest) -> tuple[str, Holding] | None:
    """(source annotation, container -> shares) for a pod, or None when no annotation says where it is. The
    source is ANN_ALLOCATED once every container the choice names is recorded, else the choice's annotation."""
    allocated = _assignment(pod, ANN_ALLOCATED)
    choice = _choice(pod)
    if allocated is None:
        return (choice[0], counted(pod, bounded(pod, choice[1]))) if choice is not None else None
    if choice is None or not set(choice[1]) - set(allocated):
        return ANN_ALLOCATED, counted(pod, bounded(pod, allocated))
    return choice[0], counted(pod, bounded(pod, {**choice[1], **allocated}))


def _assignment(pod: PodRequest, key: str) -> Holding | None:
    if key not in pod.annotations:
        return None
    try:
        return parse_assignment(pod.annotations[key], key).containers
    except AnnotationError as exc:
        log.warning("%s; ignoring it", exc, extra={"fields": {"pod": pod.key}})
        return None


def _choice(pod: PodRequest) -> tuple[str, Holding] | None:
    """Where a scheduler chose to put the pod's containers: (annotation, container -> shares), or None."""
    ann = pod.annotations
    scheduled = _assignment(pod, ANN_SCHEDULED)
    if scheduled is not None:
        return ANN_SCHEDULED, scheduled
    if ANN_ACK_ALLOCATION in ann:
        try:
            return ANN_ACK_ALLOCATION, _ack_holding(pod)
        except AnnotationError as exc:
            log.warning("%s; ignoring it", exc, extra={"fields": {"pod": pod.key}})
    if ANN_ALIYUN_MEM_IDX in ann:
        try:
            index = parse_gpu_index(ann[ANN_ALIYUN_MEM_IDX])
        except AnnotationError as exc:
            log.warning("%s; ignoring it", exc, extra={"fields": {"pod": pod.key}})
            return None
        return ANN_ALIYUN_MEM_IDX, {c.name: (GpuShare(index, "", c.mem, c.core),)
                                    for c in pod.containers if c.mem or c.core}
    return None


def _ack_holding(pod: PodRequest) -> dict[str, tuple[GpuShare, ...]]:
    mem = parse_ack_allocation(pod.annotations[ANN_ACK_ALLOCATION], ANN_ACK_ALLOCATION)
    core: dict[int, dict[int, int]] = {}
    if ANN_ACK_CORE_ALLOCATION in pod.annotations:
        core = parse_ack_allocation(pod.annotations[ANN_ACK_CORE_ALLOCATION], ANN_ACK_CORE_ALLOCATION)
    by_index = {c.app_index: c.name for c in pod.containers if not c.init}
    held: dict[str, tuple[GpuShare, ...]] = {}
    for app_index in sorted(set(mem) | set(core)):
        name = by_index.get(app_index)
        if name is None:
            continue
        gpus = sorted(set(mem.get(app_index, {})) | set(core.get(app_index, {})))
        held[name] = tuple(GpuShare(g, "", mem.get(app_index, {}).get(g, 0), core.get(app_index, {}).get(g, 0))
                           for g in gpus)
    return held


def bounded(pod: PodRequest, held: Holding) -> Holding:
    """`held` as the pod's own request allows: per GPU container, the first GPUs named (as many as it asks for),
    each with the container's per-GPU amounts; containers that ask for no GPU, and unknown names, hold nothing."""
    out: dict[str, tuple[GpuShare, ...]] = {}
    for name, shares in held.items():
        c = pod.container(name)
        if c is None or not (c.mem or c.core or c.count):
            continue
        seen: dict[int, str] = {}
        for s in shares:
            if s.index >= 0 and s.index not in seen:
                seen[s.index] = s.uuid
        if c.count:
            picked = list(seen.items())[: c.count]
            out[name] = tuple(GpuShare(i, u, 0, 0, whole=True) for i, u in picked)
            continue
        try:
            mem, core = per_gpu_share(c, pod.gpus_per_container)
        except PodRequestError:
            continue
        out[name] = tuple(GpuShare(i, u, mem, core) for i, u in list(seen.items())[: pod.gpus_per_container])
    return out


def counted(pod: PodRequest, held: Holding) -> Holding:
    """What of `held` takes room: sidecars (init containers with restartPolicy Always) for the pod's life like app
    containers; other init containers only while the pod is Pending, and then by the kubelet's rule: on each GPU
    the pod holds max(each regular init container + the sidecars started before it, app containers + sidecars).
    A regular init container is kept only for what it needs beyond that (nothing when an app container reuses its
    devices: the same GPUs and amounts are one holding, not two)."""
    init = {c.name for c in pod.containers if c.init and not c.sidecar}
    if not init & held.keys():
        return held
    steady = {name: shares for name, shares in held.items() if name not in init}
    if pod.phase != "Pending":
        return steady
    base: dict[int, list[int]] = {}  # GPU index -> [mem, core, whole] of the app containers and sidecars
    for shares in steady.values():
        for s in shares:
            b = base.setdefault(s.index, [0, 0, 0])
            b[0], b[1], b[2] = b[0] + s.mem, b[1] + s.core, b[2] or int(s.whole)
    extra: dict[int, tuple[str, GpuShare]] = {}  # GPU index -> (init container, what it needs beyond the base)
    for c in pod.containers:
        if c.name not in init or c.name not in held:
            continue
        for s in held[c.name]:
            mem, core = s.mem, s.core
            for side in pod.containers:
                if side.sidecar and side.position < c.position:
                    for t in steady.get(side.name, ()):
                        if t.index == s.index:
                            mem, core = mem + t.mem, core + t.core
            b = base.get(s.index, [0, 0, 0])
            more = GpuShare(s.index, s.uuid, max(mem - b[0], 0), max(core - b[1], 0), whole=s.whole and not b[2])
            old = extra.get(s.index)
            if old is not None:  # init containers run one after another: the most each needs, not the sum
                more = GpuShare(s.index, s.uuid or old[1].uuid, max(more.mem, old[1].mem),
                                max(more.core, old[1].core), whole=more.whole or old[1].whole)
            extra[s.index] = (old[0] if old is not None else c.name, more)
    out = dict(steady)
    for name, share in extra.values():
        if share.mem or share.core or share.whole:
            out[name] = (*out.get(name, ()), share)
    return out
