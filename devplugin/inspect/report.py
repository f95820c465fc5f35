"""The report: nodes, their GPUs with memory and compute allocated / total and the pods on each, the pods
still waiting for a GPU, and cluster totals. Pure: built from apiserver JSON (nodes and pods), the same
annotations the scheduler extender reads, so both always agree."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from devplugin.allocation.requests import PodRequestError, pod_request
from devplugin.contract import (
    ANN_ACK_ALLOCATION,
    ANN_ACK_ASSIGNED,
    ANN_ALIYUN_ASSIGNED,
    ANN_ALIYUN_MEM_IDX,
    ANN_ALLOCATED,
    ANN_NODE_GPUS,
    CORE_PER_GPU,
    NodeGpu,
)
from devplugin.inspect.use import NodeUse
from devplugin.scheduler.placements import pod_holding
from devplugin.scheduler.room import GpuRoom, node_room
from devplugin.scheduler.state import daemon_record, node_entry, not_in_usage

MIB = 1 << 20


@dataclass
class PodOnGpu:
    namespace: str
    name: str
    container: str
    mem: int
    core: int
    whole: bool
    state: str  # "allocated" (the node daemon placed it) or "scheduled" (chosen, not yet started)
    # What it uses, from its node daemon (None: not known; see NodeReport.useError)
    memUsedMiB: float | None = None
    computeUsed: float | None = None  # percent of the GPU at the daemon's last measurement
    refused: float | None = None  # allocations refused at its memory cap
    throttledSeconds: float | None = None


@dataclass
class GpuReport:
    index: int
    uuid: str
    model: str
    healthy: bool
    memTotal: int
    memAllocated: int
    coreTotal: int
    coreAllocated: int
    whole: bool
    pods: list[PodOnGpu] = field(default_factory=list)
    memUsedMiB: float | None = None  # what its containers use, from the node daemon (None: not known)
    computeUsed: float | None = None  # percent of the GPU its measured containers used
    # A MIG device shared as a GPU of its own: the UUID and NVML index of its GPU, its profile ("" / None otherwise)
    parent: str = ""
    parentIndex: int | None = None
    migProfile: str = ""
    nvlink: int | None = None  # its NVLink island (GPUs with the same one are joined by NVLink); None: none known
    numa: int | None = None


@dataclass
class NodeReport:
    name: str
    ip: str
    mode: str
    placement: str
    unitMiB: int
    memTotal: int
    memAllocated: int
    problem: str = ""
    gpus: list[GpuReport] = field(default_factory=list)
    useError: str = ""  # why the node daemon's figures of use are missing ("" when they are there)


@dataclass
class PendingPod:
    namespace: str
    name: str
    node: str  # "" while unscheduled; set for pods bound without a GPU choice
    mem: int
    core: int
    count: int


@dataclass
class Report:
    nodes: list[NodeReport]
    pending: list[PendingPod]
    memTotalMiB: int
    memAllocatedMiB: int

    def to_json(self) -> dict:
        return asdict(self)


def _state(source: str, annotations: Mapping[str, str]) -> str:
    """"allocated" once the node placed it (our record, or Alibaba's / ACK's assigned=true), else "scheduled"."""
    placed = (source == ANN_ALLOCATED
              or (source == ANN_ALIYUN_MEM_IDX and annotations.get(ANN_ALIYUN_ASSIGNED) == "true")
              or (source == ANN_ACK_ALLOCATION and annotations.get(ANN_ACK_ASSIGNED) == "true"))
    return "allocated" if placed else "scheduled"


def _ip(node: Mapping) -> str:
    for addr in (node.get("status") or {}).get("addresses") or []:
        if addr.get("type") == "InternalIP":
            return str(addr.get("address", ""))
    return ""


def _gpu_report(r: GpuRoom, g: NodeGpu | None) -> GpuReport:
    """A GPU's row from its room and its line of the node's inventory (None: the inventory does not name it)."""
    report = GpuReport(r.index, r.uuid, g.model if g is not None else "", r.healthy, r.mem_total, r.mem_allocated,
                       CORE_PER_GPU, r.core_allocated, r.whole)
    if g is not None:
        report.parent, report.parentIndex, report.migProfile = g.parent_uuid, g.parent_index, g.mig_profile
        report.nvlink, report.numa = g.nvlink_island, g.numa_node
    return report


def build_report(nodes: Iterable[Mapping], pods: Iterable[Mapping], with_pending: bool = True) -> Report:
    holdings: dict[str, list[tuple]] = {}
    pending: list[PendingPod] = []
    for obj in pods:
        try:
            pod = pod_request(obj)
        except PodRequestError:
            continue
        if pod.finished or not pod.gpu_containers:
            continue
        held = pod_holding(pod) if pod.node_name else None
        if held is None:
            if with_pending:
                pending.append(PendingPod(pod.namespace, pod.name, pod.node_name,
                                          sum(c.mem for c in pod.gpu_containers),
                                          sum(c.core for c in pod.gpu_containers),
                                          sum(c.count for c in pod.gpu_containers)))
            continue
        state = _state(held[0], pod.annotations)
        holdings.setdefault(pod.node_name, []).append((pod, held[1], state))
    out: list[NodeReport] = []
    for obj in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name", ""))):
        entry = node_entry(obj)
        if entry.inventory is None:
            if ANN_NODE_GPUS in ((obj.get("metadata") or {}).get("annotations") or {}):  # published, unreadable
                out.append(NodeReport(entry.name, _ip(obj), "", "", 1024, 0, 0, entry.problem))
            continue  # otherwise not a GPU-sharing node
        on_node = holdings.get(entry.name, [])
        # the daemon's usage already counts the containers it recorded before publishing it (the extender's rule)
        rooms = node_room(entry.inventory,
                          (not_in_usage(h, daemon_record(p), entry.usage) for p, h, _ in on_node), entry.usage)
        inv = {g.index: g for g in entry.inventory.gpus}
        gpus = [_gpu_report(r, inv.get(r.index)) for r in rooms]
        by_index = {g.index: g for g in gpus}
        for pod, held, state in sorted(on_node, key=lambda t: t[0].key):
            for container, shares in sorted(held.items()):
                for s in shares:
                    if s.index in by_index:
                        by_index[s.index].pods.append(PodOnGpu(pod.namespace, pod.name, container,
                                                               by_index[s.index].memTotal if s.whole else s.mem,
                                                               CORE_PER_GPU if s.whole else s.core, s.whole, state))
        out.append(NodeReport(entry.name, _ip(obj), entry.mode, entry.placement, entry.unit_mib,
                              sum(g.memTotal for g in gpus), sum(g.memAllocated for g in gpus), entry.problem, gpus))
    total = sum(n.memTotal * n.unitMiB for n in out)
    used = sum(n.memAllocated * n.unitMiB for n in out)
    return Report(out, sorted(pending, key=lambda p: (p.namespace, p.name)), total, used)


def attach_use(report: Report, uses: Mapping[str, NodeUse]) -> None:
    """Put each node daemon's figures of use beside the allocation: per GPU (every container on it) and per
    container. A node missing from `uses` or with an error keeps None and says why in useError."""
    for node in report.nodes:
        use = uses.get(node.name)
        if use is None or use.error:
            node.useError = use.error if use is not None else "not asked"
            continue
        by_container = use.by_container()
        for gpu in node.gpus:
            rows = [c for c in use.containers if c.uuid.lower() == gpu.uuid.lower()]
            gpu.memUsedMiB = sum(c.memory_used for c in rows) / MIB
            measured = [c.compute_used for c in rows if c.compute_used is not None]
            gpu.computeUsed = sum(measured) if measured else None
            for p in gpu.pods:
                c = by_container.get((p.namespace, p.name, p.container, gpu.uuid.lower()))
                if c is None:
                    continue
                p.memUsedMiB, p.computeUsed = c.memory_used / MIB, c.compute_used
                p.refused, p.throttledSeconds = c.refused, c.throttled_s
