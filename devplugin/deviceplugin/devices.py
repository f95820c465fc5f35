"""The device lists each resource advertises, and their health; ListAndWatch streams wait on changes here.

Health has two sources. A GPU that raised a critical XID is Unhealthy in every resource. And the kubelet keeps
separate books per resource, so the board keeps them honest about whole GPUs: while a GPU is held whole (gpu-count)
its gpu-mem and gpu-core.percentage units are reported Unhealthy (node allocatable drops, the scheduler stops
counting them); while a GPU holds slices its gpu-count device is reported Unhealthy. Both come back when freed.
"""

from __future__ import annotations

import logging
import threading

from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind, device_ids
from devplugin.api.deviceplugin.v1beta1 import api_pb2

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
WHOLE = "whole"
SHARED = "shared"


class DeviceBoard:
    """Per-GPU health and the ListAndWatch message of each resource, with a version that bumps on change."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._cond = threading.Condition()
        self._version = 0
        self._closed = False
        self._unhealthy: dict[str, str] = {}  # uuid -> reason
        self._occupancy: dict[str, str] = {}  # uuid -> WHOLE | SHARED (absent: free)
        self._ids = {kind: {g.uuid: device_ids(g, kind, node.unit) for g in node.gpus} for kind in node.kinds}
        self._messages: dict[Kind, api_pb2.ListAndWatchResponse] = {}
        self._rebuild()

    def _rebuild(self) -> None:
        for kind, per_gpu in self._ids.items():
            devices = []
            for gpu in self._node.gpus:
                taken = self._occupancy.get(gpu.uuid)
                held_other_way = taken == (SHARED if kind is Kind.COUNT else WHOLE)
                health = UNHEALTHY if gpu.uuid in self._unhealthy or held_other_way else HEALTHY
                topo = None
                if gpu.numa_node is not None:
                    topo = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa_node)])
                devices += [api_pb2.Device(ID=i, health=health, topology=topo) for i in per_gpu[gpu.uuid]]
            self._messages[kind] = api_pb2.ListAndWatchResponse(devices=devices)

    def set_health(self, uuid: str, healthy: bool, reason: str) -> bool:
        """Mark a GPU's devices (all resources) healthy or not; True if anything changed."""
        with self._cond:
            if healthy == (uuid not in self._unhealthy) or uuid not in self._node.by_uuid:
                return False
            if healthy:
                del self._unhealthy[uuid]
            else:
                self._unhealthy[uuid] = reason
            self._rebuild()
            self._version += 1
            self._cond.notify_all()
        gpu = self._node.by_uuid[uuid]
        log.warning(
            "GPU %d is now %s: %s", gpu.index, HEALTHY if healthy else UNHEALTHY, reason,
            extra={"fields": {"gpu": uuid, "gpu_index": gpu.index, "healthy": healthy}},
        )
        return True

    def is_healthy(self, uuid: str) -> bool:
        """No critical XID holds this GPU down (occupancy aside)."""
        with self._cond:
            return uuid not in self._unhealthy

    def unhealthy(self) -> dict[str, str]:
        with self._cond:
            return dict(self._unhealthy)

    def set_occupancy(self, occupancy: dict[str, str]) -> bool:
        """{GPU UUID: WHOLE | SHARED} for GPUs in use; True if the advertised health changed."""
        with self._cond:
            if occupancy == self._occupancy:
                return False
            self._occupancy = dict(occupancy)
            self._rebuild()
            self._version += 1
            self._cond.notify_all()
        return True

    def snapshot(self, kind: Kind) -> tuple[int, api_pb2.ListAndWatchResponse]:
        with self._cond:
            return self._version, self._messages[kind]

    def wait_change(
        self, kind: Kind, seen: int, alive: threading.Event
    ) -> tuple[int, api_pb2.ListAndWatchResponse] | None:
        """Block until the version moves past `seen`; None when closed or `alive` is cleared. No polling."""
        with self._cond:
            while self._version == seen and not self._closed and alive.is_set():
                self._cond.wait()
            if self._closed or not alive.is_set():
                return None
            return self._version, self._messages[kind]

    def wake(self) -> None:
        """Wake every waiting stream (a stream ended or the daemon stops)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
