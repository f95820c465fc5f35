"""Ask the kubelet's PodResources API which of our devices containers already hold (after a daemon restart)."""

from __future__ import annotations

import logging

import grpc

from devplugin.api.podresources.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


def held_devices(
    socket_path: str, resource_names: set[str], timeout_s: float = 3.0, per_container: bool = False
) -> dict[str, list] | None:
    """{resource: [device IDs held by containers]} (or, per_container, {resource: [[IDs of one container]]}),
    or None when the kubelet cannot be asked."""
    try:
        with grpc.insecure_channel(f"unix://{socket_path}") as channel:
            resp = api_pb2_grpc.PodResourcesListerStub(channel).List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout_s
            )
    except grpc.RpcError as exc:
        log.warning("PodResources at %s not available (%s): assuming no devices are held yet",
                    socket_path, exc.code().name)
        return None
    held: dict[str, list] = {r: [] for r in resource_names}
    for pod in resp.pod_resources:
        for container in pod.containers:
            mine: dict[str, list[str]] = {}
            for dev in container.devices:  # the kubelet lists one entry per device (per NUMA node)
                if dev.resource_name in held:
                    mine.setdefault(dev.resource_name, []).extend(dev.device_ids)
            for resource, ids in mine.items():
                if per_container:
                    held[resource].append(ids)
                else:
                    held[resource].extend(ids)
    return held
