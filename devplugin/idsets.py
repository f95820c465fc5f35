"""Turn device IDs from the kubelet into units per GPU, refusing IDs this node never advertised."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from devplugin.errors import RequestError
from devplugin.node import Node
from devplugin.units import InvalidDeviceID, Kind, decode_id, device_ids


@lru_cache(maxsize=64)
def _decoded(node: Node, kind: Kind) -> dict[str, tuple[str, int]]:
    """decode_id of every ID this node advertises for `kind`, computed once (the hot path of every call)."""
    return {i: decode_id(i)[::2] for g in node.gpus for i in device_ids(g, kind, node.unit)}


def group_ids(node: Node, kind: Kind, ids: Sequence[str], what: str = "device IDs") -> dict[str, list[int]]:
    """Map IDs of `kind` to {GPU UUID: [unit numbers]}, in first-seen order; RequestError on any bad ID."""
    known = _decoded(node, kind)
    groups: dict[str, list[int]] = {}
    try:
        for dev_id in ids:
            uuid, n = known[dev_id]
            units = groups.get(uuid)
            if units is None:
                groups[uuid] = [n]
            else:
                units.append(n)
    except KeyError:
        _diagnose(node, kind, ids, what)
    if sum(map(len, groups.values())) != len(set(ids)):
        dup = next(i for n, i in enumerate(ids) if i in ids[:n])
        raise RequestError(f"{node.resource_name(kind)}: {what} name {dup!r} twice; each device can be given once")
    return groups


def _diagnose(node: Node, kind: Kind, ids: Sequence[str], what: str) -> None:
    """Raise the RequestError that says why an ID is not one of this node's `kind` devices."""
    resource = node.resource_name(kind)
    for dev_id in ids:
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
    raise RequestError(f"{resource}: {what} contain an ID this node does not advertise")


def gpu_label(node: Node, uuid: str) -> str:
    """`GPU 2 (GPU-abcd...)` for messages."""
    return f"GPU {node.by_uuid[uuid].index} ({uuid})"
