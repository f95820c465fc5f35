"""What the node daemon tells the cluster: each decision on its pod, Events, and the node's GPUs and room in use.

Called under the allocator's lock on the admission path, so nothing here does I/O: annotations and Events are
handed to the writer's background queue (retries, backoff, delivered once the apiserver is back); node usage is
published by a debounced background thread. The annotation formats are the cluster contract
(devplugin/contract.py, docs/reference/contract.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from devplugin import contract as c
from devplugin.allocation.container_candidates import own_record
from devplugin.allocation.decision import Decision
from devplugin.allocation.holdings import Holding, Holdings
from devplugin.allocation.node import Node
from devplugin.allocation.ports import Reporter
from devplugin.allocation.requests import PodRequest
from devplugin.allocation.units import Kind
from devplugin.deviceplugin.devices import SHARED, WHOLE

USAGE_DEBOUNCE_S = 0.1


class Writer(Protocol):
    def patch_pod_annotations(self, namespace: str, name: str, uid: str,
                              annotations: dict[str, str | None]) -> None: ...

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None]) -> None: ...

    def pod_event(self, namespace: str, name: str, uid: str, type: str, reason: str,  # noqa: A002
                  message: str) -> None: ...

    def node_event(self, name: str, type: str, reason: str, message: str) -> None: ...  # noqa: A002


def shares_of(decision: Decision, node: Node) -> tuple[c.GpuShare, ...]:
    """The contract's view of where a container went."""
    whole = Kind.COUNT in decision.request
    out = []
    for uuid in decision.gpus:
        gpu = node.by_uuid[uuid]
        mem = node.units(uuid, Kind.MEM) if whole else decision.per_gpu.get(Kind.MEM, 0)
        core = 100 if whole else decision.per_gpu.get(Kind.CORE, 0)
        out.append(c.GpuShare(index=gpu.index, uuid=uuid, mem=mem, core=core, whole=whole))
    return tuple(out)


def describe(decision: Decision, node: Node) -> str:
    """`2 GiB and 30 % of GPU 1 (GPU-...)`, for Events."""
    gpus = ", ".join(f"GPU {node.by_uuid[u].index} ({u})" for u in decision.gpus)
    if Kind.COUNT in decision.request:
        return f"whole {gpus}"
    parts = []
    mem = decision.per_gpu.get(Kind.MEM, 0)
    if mem:
        parts.append(f"{mem} {node.unit.name}" if node.unit.mib == 1024 else f"{mem} x {node.unit.name}")
    core = decision.per_gpu.get(Kind.CORE, 0)
    if core:
        parts.append(f"{core} %")
    each = " each" if len(decision.gpus) > 1 else ""
    return f"{' and '.join(parts) or 'a share'} of {gpus}{each}"


def occupancy(holdings: Holdings, node: Node) -> dict[str, str]:
    out = {}
    for gpu in node.gpus:
        if holdings.whole(gpu.uuid):
            out[gpu.uuid] = WHOLE
        elif holdings.shared(gpu.uuid):
            out[gpu.uuid] = SHARED
    return out


def node_usage(holdings: Holdings, node: Node) -> c.NodeUsage:
    gpus = {}
    for gpu in node.gpus:
        gpus[gpu.index] = c.GpuUsage(
            mem=holdings.used(Kind.MEM, gpu.uuid), core=holdings.used(Kind.CORE, gpu.uuid),
            containers=holdings.containers_on(gpu.uuid), whole=holdings.whole(gpu.uuid))
    return c.NodeUsage(gpus=gpus, time_ns=time.time_ns())


class ClusterReporter(Reporter):
    """Records decisions on pods, raises Events, keeps the ListAndWatch health of whole GPUs, publishes usage."""

    def __init__(self, node: Node, node_name: str, writer: Writer,
                 set_occupancy: Callable[[dict[str, str]], object] = lambda occ: None) -> None:
        self.node = node
        self.node_name = node_name
        self.writer = writer
        self.set_occupancy = set_occupancy
        self._recorded: dict[str, dict[str, tuple[c.GpuShare, ...]]] = {}  # pod UID -> container -> shares
        self._usage: c.NodeUsage | None = None
        self._usage_due = threading.Event()
        self._usage_force = False  # a record was written: publish usage (with a later time) even if unchanged
        self._stopping = threading.Event()
        self._holdings: Holdings | None = None
        # runs fn(holdings) under the allocator's lock (Allocator.snapshot); set by whoever builds the allocator
        self.snapshot: Callable[[Callable[[Holdings], c.NodeUsage]], c.NodeUsage] | None = None
        self._thread = threading.Thread(target=self._publish_loop, name="usage-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._usage_due.set()

    # ------------------------------------------------------------------ Reporter
    def placed(self, decision: Decision, node: Node) -> None:
        pod = decision.pod
        if pod is None or decision.key is None:
            return
        self.record(pod, decision.key.container, shares_of(decision, node))
        text = describe(decision, node)
        reason = "GPUAssigned"
        if decision.source.startswith("devices reused"):
            reason = "GPUReused"
        self.writer.pod_event(pod.namespace, pod.name, pod.uid, "Normal", reason,
                              f"container {decision.key.container}: {text} ({decision.source})")

    def record(self, pod: PodRequest, container: str, shares: tuple[c.GpuShare, ...]) -> None:
        """Write (or complete) the pod's record of where its containers went."""
        mine = self._recorded.setdefault(pod.uid, self._already_recorded(pod))
        mine[container] = shares
        annotations: dict[str, str | None] = {
            c.ANN_ALLOCATED: c.PodAssignment(node=self.node_name, time_ns=time.time_ns(),
                                             containers=dict(mine), uid=pod.uid).render(),
            c.ANN_ALIYUN_ASSIGNED: "true",
        }
        first = next((s for name in self._order(pod, mine) for s in mine[name]), None)
        if first is not None:  # where it really went, even when a scheduler's choice was overridden
            annotations[c.ANN_ALIYUN_MEM_IDX] = str(first.index)
        if c.ANN_ACK_ALLOCATION in pod.annotations:
            annotations[c.ANN_ACK_ASSIGNED] = "true"
        self.writer.patch_pod_annotations(pod.namespace, pod.name, pod.uid, annotations)
        # The extender counts the pod in flight until the node's usage is as recent as this record
        # (devplugin/scheduler/state.py): publish it even when the totals did not change (devices reused).
        self._usage_force = True
        self._usage_due.set()

    def record_holding(self, pod: PodRequest, holding: Holding, node: Node) -> None:
        if holding.key is None:
            return
        shares = []
        whole = Kind.COUNT in holding.ids
        for uuid in sorted(holding.gpus(), key=lambda u: node.by_uuid[u].index):
            gpu = node.by_uuid[uuid]
            mem = len(holding.ids.get(Kind.MEM, {}).get(uuid, ()))
            core = len(holding.ids.get(Kind.CORE, {}).get(uuid, ()))
            shares.append(c.GpuShare(index=gpu.index, uuid=uuid, mem=node.units(uuid, Kind.MEM) if whole else mem,
                                     core=100 if whole else core, whole=whole))
        self.record(pod, holding.key.container, tuple(shares))

    @staticmethod
    def _order(pod: PodRequest, recorded: dict[str, tuple[c.GpuShare, ...]]) -> list[str]:
        """Recorded container names in the pod's order (app containers first: Alibaba's index is the pod's)."""
        order = [ct.name for ct in pod.containers if not ct.init] + [ct.name for ct in pod.containers if ct.init]
        return [n for n in order if n in recorded] + sorted(n for n in recorded if n not in order)

    def _already_recorded(self, pod: PodRequest) -> dict[str, tuple[c.GpuShare, ...]]:
        """The daemon's own earlier record on this pod; anything else found there is replaced (with a Warning)."""
        raw = pod.annotations.get(c.ANN_ALLOCATED)
        if not raw:
            return {}
        record = own_record(pod)
        if record is None:
            try:
                c.parse_assignment(raw, c.ANN_ALLOCATED)
                why = f"annotation {c.ANN_ALLOCATED} was not written by the node daemon for this pod (its UID differs)"
            except c.AnnotationError as exc:
                why = str(exc)
            self.warning(pod, "GPURecordReplaced", f"{why}; ignored for room and replaced by the node daemon's record")
            return {}
        return dict(record.containers)

    def refused(self, pod: PodRequest | None, container: str | None, message: str) -> None:
        if pod is None:
            return
        named = message.startswith(("container ", "pod "))
        self.writer.pod_event(pod.namespace, pod.name, pod.uid, "Warning", "GPUAllocationFailed",
                              message if named else f"container {container}: {message}")

    def warning(self, pod: PodRequest, reason: str, message: str) -> None:
        self.writer.pod_event(pod.namespace, pod.name, pod.uid, "Warning", reason, message)

    def occupancy_changed(self, holdings: Holdings) -> None:
        self.set_occupancy(occupancy(holdings, self.node))
        self._holdings = holdings
        self._usage_due.set()  # the publisher takes the snapshot, under the allocator's lock, off the admission path

    def forget_pod(self, pod_uid: str) -> None:
        self._recorded.pop(pod_uid, None)

    # ------------------------------------------------------------------ node annotations
    def publish_inventory(self, healthy: Callable[[str], bool]) -> None:
        inv = c.NodeInventory(
            mode=self.node.mode, placement=self.node.placement, mem_unit_mib=self.node.unit.mib,
            domain=self.node.domain,
            gpus=tuple(c.NodeGpu(index=g.index, uuid=g.uuid, model=g.name,
                                 mem_units=self.node.units(g.uuid, Kind.MEM), memory_mib=g.memory_bytes >> 20,
                                 healthy=healthy(g.uuid), nvlink_island=g.nvlink_island, numa_node=g.numa_node,
                                 parent_uuid=g.parent_uuid, parent_index=g.parent_index, mig_profile=g.mig_profile)
                        for g in self.node.gpus))
        self.writer.patch_node_annotations(self.node_name, {c.ANN_NODE_GPUS: inv.render()})

    def republish(self, healthy: Callable[[str], bool]) -> None:
        """Write the inventory and usage again (the Node object was re-created without them)."""
        self.publish_inventory(healthy)
        self._usage_force = True
        self._usage_due.set()

    def _publish_loop(self) -> None:
        while not self._stopping.is_set():
            self._usage_due.wait()
            if self._stopping.is_set():
                return
            self._stopping.wait(USAGE_DEBOUNCE_S)
            self._usage_due.clear()
            holdings, snapshot = self._holdings, self.snapshot
            if holdings is None:
                continue
            usage = snapshot(lambda h: node_usage(h, self.node)) if snapshot else node_usage(holdings, self.node)
            forced, self._usage_force = self._usage_force, False
            if not forced and self._usage is not None and dict(usage.gpus) == dict(self._usage.gpus):
                continue
            self._usage = usage
            self.writer.patch_node_annotations(self.node_name, {c.ANN_NODE_USAGE: usage.render()})
