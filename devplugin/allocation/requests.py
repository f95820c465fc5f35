"""What a pod asks of our resources, container by container, read from the pod as JSON (a dict).

Shared by the node daemon (which container is the kubelet admitting?), the scheduler extender (does it fit?),
the admission webhooks (is it valid?) and inspect. Pure: no I/O. Pods come as the apiserver's JSON (camelCase
keys, as in an AdmissionReview or a raw watch event).

Containers are listed in the kubelet's admission order: init containers first, then app containers, each in
spec order. Only limits count for extended resources (the apiserver requires requests == limits for them); a
container that sets only requests is read from its requests.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from devplugin.bounded import MAX_GPU_INDEX, RefusedValue, nat_text, whole_quantity
from devplugin.contract import (
    ANN_MULTI_GPU,
    CORE_PER_GPU,
    CORE_STEP,
    DEFAULT_RESOURCE_DOMAIN,
    LABEL_ACK_MULTI_GPU,
    RESOURCE_CORE,
    RESOURCE_COUNT,
    RESOURCE_MEM,
)

FINISHED_PHASES = ("Succeeded", "Failed")
_AMOUNT_FIELD = {RESOURCE_MEM: "mem", RESOURCE_CORE: "core", RESOURCE_COUNT: "count"}  # ContainerRequest.amount()


class PodRequestError(ValueError):
    """A pod whose GPU request cannot be honoured as written; the message says what to change."""


@dataclass(frozen=True)
class ContainerRequest:
    """One container's asks. `position` is its place in the kubelet's order; `app_index` its index in
    spec.containers (ACK's container index), -1 for init containers. `sidecar`: an init container with
    restartPolicy Always, which runs (and keeps its devices) for the pod's life."""

    name: str
    init: bool
    position: int
    app_index: int
    mem: int = 0
    core: int = 0
    count: int = 0
    sidecar: bool = False

    @property
    def wants_gpu(self) -> bool:
        return bool(self.mem or self.core or self.count)

    def amount(self, resource: str) -> int:
        """The amount of `resource` (short name: gpu-mem, gpu-core.percentage, gpu-count)."""
        return getattr(self, _AMOUNT_FIELD[resource])  # called for every container of every pod on each lookup


@dataclass(frozen=True)
class PodRequest:
    """A pod as placement sees it."""

    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str
    created: float  # Unix seconds (0 when unknown)
    containers: tuple[ContainerRequest, ...]
    gpus_per_container: int = 1  # multi-GPU sharing: each container's share split over this many GPUs
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    seen: int = 0  # order in which the pod cache first saw it bound here (the kubelet sees pods in that order)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def gpu_containers(self) -> tuple[ContainerRequest, ...]:
        return tuple(c for c in self.containers if c.wants_gpu)

    def container(self, name: str) -> ContainerRequest | None:
        return next((c for c in self.containers if c.name == name), None)


def resource_names(domain: str = DEFAULT_RESOURCE_DOMAIN) -> tuple[str, str, str]:
    """(gpu-mem, gpu-core.percentage, gpu-count) full names for a domain."""
    return f"{domain}/{RESOURCE_MEM}", f"{domain}/{RESOURCE_CORE}", f"{domain}/{RESOURCE_COUNT}"


def quantity(value: object, what: str) -> int:
    """An extended-resource quantity as a whole number (`4`, `1e1`, `2k`, `1Ki` are whole); PodRequestError for
    fractions, negatives, junk and values past bounded.MAX_AMOUNT."""
    try:
        return whole_quantity(value, what)
    except RefusedValue as exc:
        raise PodRequestError(str(exc)) from None


def _container(spec: Mapping, position: int, app_index: int, init: bool, domain: str) -> ContainerRequest:
    name = str(spec.get("name", ""))
    res = spec.get("resources") or {}
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    mem_name, core_name, count_name = resource_names(domain)
    amounts = []
    for full in (mem_name, core_name, count_name):
        raw = limits.get(full, requests.get(full, 0))
        amounts.append(quantity(raw, f"container {name!r}: {full}"))
    return ContainerRequest(name=name, init=init, position=position, app_index=app_index,
                            mem=amounts[0], core=amounts[1], count=amounts[2],
                            sidecar=init and spec.get("restartPolicy") == "Always")


def parse_time(text: str | None) -> float:
    """RFC 3339 `2026-11-23T07:42:00Z` as Unix seconds; 0 when absent or unreadable."""
    if not text:
        return 0.0
    try:
        return float(calendar.timegm(time.strptime(str(text).replace("Z", "")[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0.0


def multi_gpu_count(labels: Mapping[str, str], annotations: Mapping[str, str]) -> int:
    """N for multi-GPU sharing (ACK's pod label aliyun.com/gpu-count, or our annotation); 1 when unset."""
    raw = annotations.get(ANN_MULTI_GPU, labels.get(LABEL_ACK_MULTI_GPU))
    if raw in (None, "", "0"):
        return 1
    try:
        n = nat_text(raw, "multi-GPU count", MAX_GPU_INDEX + 1)
    except RefusedValue:
        raise PodRequestError(f"multi-GPU count {str(raw)[:40]!r} (label {LABEL_ACK_MULTI_GPU} or annotation "
                              f"{ANN_MULTI_GPU}) is not a whole number 1..{MAX_GPU_INDEX + 1} written in the digits "
                              "0-9") from None
    if n < 1:
        raise PodRequestError(f"multi-GPU count {n} must be 1 or more")
    return n


def pod_request(pod: Mapping, domain: str = DEFAULT_RESOURCE_DOMAIN) -> PodRequest:
    """Read a pod (apiserver JSON) into a PodRequest; PodRequestError on unreadable quantities."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    containers: list[ContainerRequest] = []
    for spec_c in spec.get("initContainers") or []:
        containers.append(_container(spec_c, len(containers), -1, True, domain))
    for i, spec_c in enumerate(spec.get("containers") or []):
        containers.append(_container(spec_c, len(containers), i, False, domain))
    seen: set[str] = set()
    for c in containers:  # the apiserver refuses such a pod; a request built by hand may still carry one
        if c.name in seen:
            raise PodRequestError(f"container name {c.name!r} is used twice (containers and initContainers "
                                  "share one namespace of names); give each container its own name")
        seen.add(c.name)
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    return PodRequest(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name") or meta.get("generateName") or ""),
        uid=str(meta.get("uid", "")),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        created=parse_time(meta.get("creationTimestamp")),
        containers=tuple(containers),
        gpus_per_container=multi_gpu_count(labels, annotations),
        annotations=annotations,
        labels=labels,
    )


def per_gpu_share(container: ContainerRequest, gpus: int) -> tuple[int, int]:
    """(gpu-mem units, core percent) on each of `gpus` GPUs for a multi-GPU share; PodRequestError when the
    amounts do not divide into whole units."""
    if gpus <= 1:
        return container.mem, container.core
    if container.mem % gpus:
        raise PodRequestError(
            f"container {container.name!r}: {container.mem} gpu-mem units do not split evenly over {gpus} GPUs; "
            f"ask for a multiple of {gpus}")
    if container.core % gpus or (container.core // gpus) % CORE_STEP:
        raise PodRequestError(
            f"container {container.name!r}: gpu-core.percentage {container.core} over {gpus} GPUs gives "
            f"{container.core / gpus:g} % each; ask for a multiple of {gpus * CORE_STEP}")
    return container.mem // gpus, container.core // gpus


def check_core(amount: int, gpus: int = 1) -> str | None:
    """Why a gpu-core.percentage amount is invalid, or None."""
    if amount % CORE_STEP or not CORE_STEP <= amount <= CORE_PER_GPU * gpus:
        return (f"gpu-core.percentage {amount} is not a valid compute share; ask for a multiple of {CORE_STEP} "
                f"from {CORE_STEP} to {CORE_PER_GPU * gpus}")
    return None
