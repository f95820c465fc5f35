"""Turn device IDs from the kubelet into units per GPU, refusing IDs this node never advertised."""

from __future__ import annotations

from collections.abc import Iterable

from devplugin.errors import RequestError
from devplugin.node import Node
from devplugin.units import InvalidDeviceID, Kind, decode_id


def group_ids(node: Node, kind: Kind, ids: Iterable[str], what: str = "device IDs") -> dict[str, list[int]]:
    """Map IDs of `kind` to {GPU UUID: [unit numbers]}, in first-seen order; RequestError on any bad ID."""
    groups: dict[str, list[int]] = {}
    seen: set[str] = set()
    resource = node.resource_name(kind)
    for dev_id in ids:
        if dev_id in seen:
            raise RequestError(f"{resource}: {what} name {dev_id!r} twice; each device can be given once")
        seen.add(dev_id)
        try:
            uuid, got, n = decode_id(dev_id)
        except InvalidDeviceID as exc:
            raise RequestError(f"{resource}: unknown device ID in {what}: {exc}") from None
        if got is not kind:
            raise RequestError(
                f"{resource}: {what} contain {dev_id!r}, a {got.value} device; "
                f"the kubelet must send {kind.value} devices to this resource's plugin"
            )
        gpu = node.by_uuid.get(uuid)
        if gpu is None:
            raise RequestError(
                f"{resource}: device {dev_id!r} names GPU {uuid}, which this node does not have; "
                "if the GPUs changed, restart the kubelet's pods on this node"
            )
        if n >= node.units(uuid, kind):
            raise RequestError(
                f"{resource}: device {dev_id!r} is beyond GPU {gpu.index}'s {node.units(uuid, kind)} units "
                f"(was the gpu-mem unit changed from {node.unit.name}?)"
            )
        groups.setdefault(uuid, []).append(n)
    return groups


def gpu_label(node: Node, uuid: str) -> str:
    """`GPU 2 (GPU-abcd...)` for messages."""
    return f"GPU {node.by_uuid[uuid].index} ({uuid})"
