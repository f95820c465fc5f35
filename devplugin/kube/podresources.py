"""Ask the kubelet's PodResources API which of our devices containers hold (the node sync, and the shim janitor)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from devplugin.allocation.units import Kind
from devplugin.api.podresources.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldContainer:
    """A container the kubelet lists with devices of ours: {resource: [device IDs]}."""

    namespace: str
    pod: str
    container: str
    devices: dict[Kind, list[str]]


def list_containers(socket_path: str, resources: Mapping[str, Kind],
                    timeout_s: float = 3.0) -> list[HeldContainer] | None:
    """Every container holding any of `resources` (full resource name -> kind); None when the kubelet cannot be
    asked."""
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
            mine: dict[Kind, list[str]] = {}
            for dev in container.devices:  # the kubelet lists one entry per device (per NUMA node)
                kind = resources.get(dev.resource_name)
                if kind is not None:
                    mine.setdefault(kind, []).extend(dev.device_ids)
            if mine:
                found.append(HeldContainer(pod.namespace, pod.name, container.name, mine))
    return found
