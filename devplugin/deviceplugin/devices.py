"""The device lists each resource advertises, and their health; ListAndWatch streams wait on changes here.

Health has two sources. A GPU that raised a critical XID is Unhealthy in every resource. And the kubelet keeps
separate books per resource, so the board keeps them honest about whole GPUs: while a GPU is held whole (gpu-count)
its gpu-mem and gpu-core.percentage units are reported Unhealthy (node allocatable drops, the scheduler stops
counting them); while a GPU holds slices its gpu-count device is reported Unhealthy. Both come back when freed.

Such a change is sent while the kubelet's Allocate for the container that caused it is in flight, and is sent once
more RESEND_S later. The kubelet writes its device checkpoint after every device list it receives and after every
allocation, each from a snapshot taken under its lock but written to disk after releasing it
(devicemanager.writeCheckpoint): the write of the list's snapshot, taken before the allocation was recorded, can
land after the allocation's own, and the checkpoint on disk then lacks the container until the next write. A
kubelet restarted in that window forgets the container's devices and may give them again. The second sending makes
that next write come at once, from a snapshot that holds the allocation.
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
RESEND_S = 1.0  # an occupancy change is sent again this long after (the kubelet's checkpoint, above)


class DeviceBoard:
    """Per-GPU health and the ListAndWatch message of each resource, each with a version that bumps when that
    resource's message changes (a GPU going from free to shared changes only gpu-count's: the gpu-mem and
    gpu-core.percentage streams, with their thousands of devices, are not rebuilt nor re-sent)."""

    def __init__(self, node: Node, resend_s: float = RESEND_S) -> None:
        self._node = node
        self._resend_s = resend_s
        self._resend: set[Kind] = set()  # kinds to send again once the timer fires
        self._timer: threading.Timer | None = None
        self._cond = threading.Condition()
        self._versions: dict[Kind, int] = {kind: 0 for kind in node.kinds}
        self._closed = False
        self._unhealthy: dict[str, str] = {}  # uuid -> reason
        self._occupancy: dict[str, str] = {}  # uuid -> WHOLE | SHARED (absent: free)
        self._ids = {kind: {g.uuid: device_ids(g, kind, node.unit) for g in node.gpus} for kind in node.kinds}
        self._messages: dict[Kind, api_pb2.ListAndWatchResponse] = {}
        self._rebuild(self._node.kinds)

    def _health(self, kind: Kind, uuid: str, occupancy: dict[str, str]) -> str:
        held_other_way = occupancy.get(uuid) == (SHARED if kind is Kind.COUNT else WHOLE)
        kept = self._node.kept_whole(uuid)  # GPUs kept for one way: never offered the other way
        other_way = kept is not None and kept != (kind is Kind.COUNT)
        return UNHEALTHY if uuid in self._unhealthy or held_other_way or other_way else HEALTHY

    def _changed(self, kinds: tuple[Kind, ...] | list[Kind]) -> None:
        """Rebuild these resources' messages and wake their streams (under the condition's lock)."""
        if not kinds:
            return
        self._rebuild(kinds)
        for kind in kinds:
            self._versions[kind] += 1
        self._cond.notify_all()

    def _rebuild(self, kinds: tuple[Kind, ...] | list[Kind]) -> None:
        for kind in kinds:
            per_gpu = self._ids[kind]
            devices = []
            for gpu in self._node.gpus:
                health = self._health(kind, gpu.uuid, self._occupancy)
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
            self._changed(self._node.kinds)
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
            touched = {u for u in set(occupancy) | set(self._occupancy) if occupancy.get(u) != self._occupancy.get(u)}
            kinds = [k for k in self._node.kinds
                     if any(self._health(k, u, occupancy) != self._health(k, u, self._occupancy) for u in touched)]
            self._occupancy = dict(occupancy)
            self._changed(kinds)
            self._send_again_later(kinds)
        return True

    def _send_again_later(self, kinds: list[Kind]) -> None:
        """Bump these kinds' versions once more after resend_s, coalescing changes meanwhile (under the lock)."""
        if not kinds or self._closed:
            return
        self._resend.update(kinds)
        if self._timer is None:
            self._timer = threading.Timer(self._resend_s, self._send_again)
            self._timer.daemon = True
            self._timer.start()

    def _send_again(self) -> None:
        with self._cond:
            self._timer = None
            kinds = [k for k in self._node.kinds if k in self._resend]
            self._resend.clear()
            if self._closed:
                return
            for kind in kinds:  # the same message again: the kubelet rewrites its checkpoint on receiving it
                self._versions[kind] += 1
            self._cond.notify_all()

    def snapshot(self, kind: Kind) -> tuple[int, api_pb2.ListAndWatchResponse]:
        with self._cond:
            return self._versions[kind], self._messages[kind]

    def wait_change(
        self, kind: Kind, seen: int, alive: threading.Event
    ) -> tuple[int, api_pb2.ListAndWatchResponse] | None:
        """Block until `kind`'s version moves past `seen`; None when closed or `alive` is cleared. No polling."""
        with self._cond:
            while self._versions[kind] == seen and not self._closed and alive.is_set():
                self._cond.wait()
            if self._closed or not alive.is_set():
                return None
            return self._versions[kind], self._messages[kind]

    def wake(self) -> None:
        """Wake every waiting stream (a stream ended or the daemon stops)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._cond.notify_all()
