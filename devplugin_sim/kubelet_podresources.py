"""The kubelet's PodResources service (v1): what pods hold and which devices are allocatable."""

from __future__ import annotations

import logging

import grpc

from devplugin.api.podresources.v1 import api_pb2 as pr_pb2
from devplugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplugin_sim.kubelet_manager import DeviceManager
from devplugin_sim.pods import PodSpec

log = logging.getLogger(__name__)


def _container_devices(resource: str, device_id: str, numa: list[int]) -> list[pr_pb2.ContainerDevices]:
    # mirrors containerDevicesFromResourceDeviceInstances: one entry per device and NUMA node; a device
    # without topology is reported once, without topology
    if not numa:
        return [pr_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id])]
    return [pr_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id],
                                    topology=pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=n)]))
            for n in numa]


def pod_resources(m: DeviceManager, pod: PodSpec) -> pr_pb2.PodResources:
    """One pod, all its containers, each with the device IDs it holds per resource."""
    out = pr_pb2.PodResources(name=pod.name, namespace=pod.namespace)
    with m.lock:
        for c in pod.containers:
            cr = out.containers.add(name=c.name)
            for resource, alloc in sorted(m.pod_devices.container(pod.uid, c.name).items()):
                if alloc.listed is None:  # an allocation never changes: its entries are built once
                    one = pr_pb2.ContainerResources()
                    for device_id in alloc.device_ids:
                        one.devices.extend(_container_devices(resource, device_id, alloc.numa.get(device_id, [])))
                    alloc.listed = one.SerializeToString()
                cr.MergeFromString(alloc.listed)
    return out


def allocatable_devices(m: DeviceManager) -> list[pr_pb2.ContainerDevices]:
    """Healthy devices of every resource (ManagerImpl.GetAllocatableDevices)."""
    out: list[pr_pb2.ContainerDevices] = []
    with m.lock:
        for resource in sorted(m.table.healthy):
            for device_id in sorted(m.table.healthy[resource]):
                out.extend(_container_devices(resource, device_id, m.table.numa_nodes(resource, device_id)))
    return out


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    """List, GetAllocatableResources and Get over the emulator's state."""

    def __init__(self, manager: DeviceManager) -> None:
        self._m = manager

    def List(self, request: pr_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
             ) -> pr_pb2.ListPodResourcesResponse:
        with self._m.lock:
            pods = list(self._m.pods.values())
        log.debug("PodResources List: %d pods", len(pods))
        return pr_pb2.ListPodResourcesResponse(pod_resources=[pod_resources(self._m, p) for p in pods])

    def GetAllocatableResources(self, request: pr_pb2.AllocatableResourcesRequest,
                                context: grpc.ServicerContext) -> pr_pb2.AllocatableResourcesResponse:
        return pr_pb2.AllocatableResourcesResponse(devices=allocatable_devices(self._m))

    def Get(self, request: pr_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
            ) -> pr_pb2.GetPodResourcesResponse:
        with self._m.lock:
            found = [p for p in self._m.pods.values()
                     if p.name == request.pod_name and p.namespace == request.pod_namespace]
        if not found:
            # the kubelet's text; it answers with code Unknown
            context.abort(grpc.StatusCode.UNKNOWN,
                          f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
        return pr_pb2.GetPodResourcesResponse(pod_resources=pod_resources(self._m, found[0]))
