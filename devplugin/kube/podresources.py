"""Ask the kubelet's PodResources API which of our devices containers hold (after a restart, and for cleanup)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from devplugin.api.podresources.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldContainer:
    """A container the kubelet lists with devices of ours: {resource name: [device IDs]}."""

    namespace: str
    pod: str
    container: str
    devices: dict[str, list[str]]


def list_containers(socket_path: str, resource_names: set[str],
                    timeout_s: float = 3.0) -> list[HeldContainer] | None:
    """Every container holding any of `resource_names`; None when the kubelet cannot be asked."""
    try:
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            resp = api_pb2_grpc.PodResourcesListerStub(channel).List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout_s
            )
    except grpc.RpcError as exc:
        log.warning("PodResources at %s not available (%s): the node's held devices cannot be read yet",
                    socket_path, exc.code().name, extra={"fields": {"socket": socket_path}})
        return None
    found = []
    for pod in resp.pod_resources:
        for container in pod.containers:
            mine: dict[str, list[str]] = {}
            for dev in container.devices:  # the kubelet lists one entry per device (per NUMA node)
                if dev.resource_name in resource_names:
                    mine.setdefault(dev.resource_name, []).extend(dev.device_ids)
            if mine:
                found.append(HeldContainer(pod.namespace, pod.name, container.name, mine))
    return found


def containers_devices(socket_path: str, resource_names: set[str],
                       timeout_s: float = 3.0) -> list[dict[str, list[str]]] | None:
    """One {resource: [device IDs]} per container holding any of `resource_names`; None when the kubelet
    cannot be asked."""
    found = list_containers(socket_path, resource_names, timeout_s)
    return None if found is None else [c.devices for c in found]


def held_devices(socket_path: str, resource_names: set[str]) -> dict[str, list[str]] | None:
    """{resource: [device IDs held by any container]}, or None when the kubelet cannot be asked."""
    found = containers_devices(socket_path, resource_names)
    if found is None:
        return None
    held: dict[str, list[str]] = {r: [] for r in resource_names}
    for container in found:
        for resource, ids in container.items():
            held[resource].extend(ids)
    return held
