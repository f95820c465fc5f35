"""Turn device IDs from the kubelet into units per GPU, refusing IDs this node never advertised."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from devplugin.allocation.errors import RequestError
from devplugin.allocation.node import Node
from devplugin.allocation.units import InvalidDeviceID, Kind, decode_id, device_ids


@dataclass(frozen=True)
class IdIndex:
    """Every ID this node advertises for one resource: all of them, per GPU (in index order), unit numbers."""

    every: frozenset[str]
    per_gpu: tuple[tuple[str, frozenset[str]], ...]
    unit: dict[str, int]


def id_index(node: Node, kind: Kind) -> IdIndex:
    """Built once per node and resource: requests are then checked and grouped with set operations."""
    idx = node.memo.get(kind)
    if idx is None:
        idx = node.memo[kind] = _build_index(node, kind)
    return idx


def _build_index(node: Node, kind: Kind) -> IdIndex:
    per_gpu = tuple((g.uuid, frozenset(device_ids(g, kind, node.unit))) for g in node.gpus)
    every = frozenset().union(*(ids for _, ids in per_gpu))
    return IdIndex(every, per_gpu, {i: decode_id(i)[2] for i in every})


def group_ids(node: Node, kind: Kind, ids: Sequence[str], what: str = "device IDs") -> dict[str, set[str]]:
    """Map IDs of `kind` to {GPU UUID: {IDs}} in GPU index order; RequestError on any bad or repeated ID."""
    idx = id_index(node, kind)
    wanted = set(ids)
    if len(wanted) != len(ids):
        dup = next(i for n, i in enumerate(ids) if i in ids[:n])
        raise RequestError(f"{node.resource_name(kind)}: {what} name {dup!r} twice; each device can be given once")
    if not wanted <= idx.every:
        _diagnose(node, kind, [i for i in ids if i not in idx.every], what)
    groups: dict[str, set[str]] = {}
    for uuid, mine in idx.per_gpu:
        common = wanted & mine
        if common:
            groups[uuid] = common
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
