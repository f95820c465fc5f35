"""The device manager's device sets per resource: all, healthy, unhealthy. Not locked: the caller locks."""

from __future__ import annotations

import logging

from devplugin.api.deviceplugin.v1beta1 import api_pb2

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class DeviceTable:
    """Mirrors ManagerImpl.allDevices / healthyDevices / unhealthyDevices."""

    def __init__(self) -> None:
        self.all: dict[str, dict[str, api_pb2.Device]] = {}
        self.healthy: dict[str, set[str]] = {}
        self.unhealthy: dict[str, set[str]] = {}

    # mirrors ManagerImpl.genericDeviceUpdateCallback: each ListAndWatch message replaces the whole set
    def replace(self, resource: str, devices: list[api_pb2.Device]) -> None:
        self.all[resource] = {d.ID: d for d in devices}
        self.healthy[resource] = {d.ID for d in devices if d.health == HEALTHY}
        self.unhealthy[resource] = {d.ID for d in devices if d.health != HEALTHY}
        log.debug("resource %s: %d devices, %d healthy", resource, len(devices), len(self.healthy[resource]))

    # mirrors ManagerImpl.markResourceUnhealthy
    def mark_unhealthy(self, resource: str) -> None:
        moved = self.healthy.get(resource, set())
        self.healthy[resource] = set()
        self.unhealthy[resource] = self.unhealthy.get(resource, set()) | moved
        log.debug("resource %s: all %d devices marked unhealthy", resource, len(self.unhealthy[resource]))

    # mirrors ManagerImpl.readCheckpoint: a resource known from the checkpoint reads zero until it registers
    def reset_empty(self, resource: str) -> None:
        self.all[resource] = {}
        self.healthy[resource] = set()
        self.unhealthy[resource] = set()

    # mirrors the delete branch of ManagerImpl.GetCapacity
    def drop(self, resource: str) -> None:
        self.all.pop(resource, None)
        self.healthy.pop(resource, None)
        self.unhealthy.pop(resource, None)
        log.debug("resource %s: dropped", resource)

    def clear(self) -> None:
        self.all.clear()
        self.healthy.clear()
        self.unhealthy.clear()

    def resources(self) -> set[str]:
        return set(self.healthy) | set(self.unhealthy)

    # mirrors ManagerImpl.GetCapacity: capacity counts all devices, allocatable the healthy ones
    def capacity(self) -> dict[str, int]:
        return {r: len(self.healthy.get(r, ())) + len(self.unhealthy.get(r, ())) for r in self.resources()}

    def allocatable(self) -> dict[str, int]:
        return {r: len(self.healthy.get(r, ())) for r in self.resources()}

    def health(self, resource: str) -> dict[str, str]:
        out = {i: UNHEALTHY for i in self.unhealthy.get(resource, ())}
        out.update({i: HEALTHY for i in self.healthy.get(resource, ())})
        return out

    def numa_nodes(self, resource: str, device_id: str) -> list[int]:
        d = self.all.get(resource, {}).get(device_id)
        if d is None or not d.HasField("topology"):
            return []
        return [n.ID for n in d.topology.nodes]
