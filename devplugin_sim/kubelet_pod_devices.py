"""Which devices each pod's containers hold, with the plugin's Allocate answer. The caller locks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from devplugin.api.deviceplugin.v1beta1 import api_pb2

log = logging.getLogger(__name__)


@dataclass
class ContainerAllocation:
    """One resource of one container: device IDs (as sent in Allocate), NUMA nodes per ID, the answer."""

    device_ids: list[str]
    response: api_pb2.ContainerAllocateResponse
    numa: dict[str, list[int]]
    listed: bytes | None = None  # its PodResources entries, serialised once (PodResources lists them on every List)


class PodDevices:
    """Mirrors devicemanager podDevices: pod uid -> container -> resource -> allocation."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, dict[str, ContainerAllocation]]] = {}

    # mirrors podDevices.insert
    def insert(self, uid: str, container: str, resource: str, alloc: ContainerAllocation) -> None:
        self.pods.setdefault(uid, {}).setdefault(container, {})[resource] = alloc

    # mirrors podDevices.delete
    def delete(self, uid: str) -> bool:
        return self.pods.pop(uid, None) is not None

    def has_pod(self, uid: str) -> bool:
        return uid in self.pods

    # mirrors podDevices.containerDevices
    def container_devices(self, uid: str, container: str, resource: str) -> list[str] | None:
        alloc = self.pods.get(uid, {}).get(container, {}).get(resource)
        return None if alloc is None else list(alloc.device_ids)

    def container(self, uid: str, container: str) -> dict[str, ContainerAllocation]:
        return dict(self.pods.get(uid, {}).get(container, {}))

    # mirrors podDevices.devices: every allocated ID, per resource
    def devices(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for containers in self.pods.values():
            for resources in containers.values():
                for resource, alloc in resources.items():
                    out.setdefault(resource, set()).update(alloc.device_ids)
        return out

    def clear(self) -> None:
        self.pods.clear()
