"""Ask the kubelet's PodResources API which of our devices containers hold (the node sync, and the shim janitor)."""

from __future__ import annotations

import logging
import threading
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


# one channel and its stub per socket, kept: a read is on the admission path
_channels: dict[str, tuple[grpc.Channel, api_pb2_grpc.PodResourcesListerStub]] = {}
_channels_lock = threading.Lock()


def _list(socket_path: str, timeout_s: float) -> api_pb2.ListPodResourcesResponse:
    """List over the kept channel; once more over a new one when that fails (the kubelet restarted)."""
    for attempt in (1, 2):
        with _channels_lock:
            kept = _channels.get(socket_path)
            if kept is None:
                channel = grpc.insecure_channel(f"unix://{socket_path}")
                kept = _channels[socket_path] = (channel, api_pb2_grpc.PodResourcesListerStub(channel))
        channel, stub = kept
        try:
            return stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
        except grpc.RpcError:
            with _channels_lock:
                if _channels.get(socket_path) is kept:
                    del _channels[socket_path]
            channel.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class NodeListing:
    """One PodResources List: every pod the kubelet lists (namespace, name), and the containers holding our
    devices."""

    pods: frozenset[tuple[str, str]]
    containers: list[HeldContainer]


def list_node(socket_path: str, resources: Mapping[str, Kind], timeout_s: float = 3.0) -> NodeListing | None:
    """Every pod the kubelet lists and every container holding any of `resources` (full resource name -> kind);
    None when the kubelet cannot be asked."""
    try:
        resp = _list(socket_path, timeout_s)
    except grpc.RpcError as exc:
        log.warning("PodResources at %s not available (%s): the node's held devices cannot be read yet",
                    socket_path, exc.code().name, extra={"fields": {"socket": socket_path}})
        return None
    found = []
    get = resources.get
    for pod in resp.pod_resources:
        for container in pod.containers:
            mine: dict[Kind, list[str]] = {}
            # the kubelet lists one entry per device (per NUMA node): hundreds per read, and a read is on the
            # admission path, so each entry's two fields are read once, in one pass
            for name, ids in [(dev.resource_name, dev.device_ids) for dev in container.devices]:
                kind = get(name)
                if kind is None:
                    continue
                if kind in mine:
                    mine[kind] += ids
                else:
                    mine[kind] = list(ids)
            if mine:
                found.append(HeldContainer(pod.namespace, pod.name, container.name, mine))
    return NodeListing(_pods(resp), found)


def list_pods(socket_path: str, timeout_s: float = 3.0) -> frozenset[tuple[str, str]] | None:
    """Every pod the kubelet lists (namespace, name), their devices not read; None when the kubelet cannot be
    asked."""
    try:
        resp = _list(socket_path, timeout_s)
    except grpc.RpcError as exc:
        log.warning("PodResources at %s not available (%s): the pods the kubelet admitted cannot be read",
                    socket_path, exc.code().name, extra={"fields": {"socket": socket_path}})
        return None
    return _pods(resp)


def _pods(resp: api_pb2.ListPodResourcesResponse) -> frozenset[tuple[str, str]]:
    return frozenset((p.namespace, p.name) for p in resp.pod_resources)


def list_containers(socket_path: str, resources: Mapping[str, Kind],
                    timeout_s: float = 3.0) -> list[HeldContainer] | None:
    """Every container holding any of `resources` (full resource name -> kind); None when the kubelet cannot be
    asked."""
    listing = list_node(socket_path, resources, timeout_s)
    return listing.containers if listing is not None else None
