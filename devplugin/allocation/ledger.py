"""The kubelet's view of which devices are free, per resource and GPU.

The kubelet is the ledger: each GetPreferredAllocation carries its `available` IDs for one resource, which
replace what we knew of that resource; each Allocate takes its IDs out until the kubelet tells us again. After a
restart the allocated IDs come from the PodResources API. Placement reads the resource being placed from the
request itself and uses this view only to look across resources (is GPU 1 held whole by gpu-count? has it any
gpu-core.percentage left for this container's other half?).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from devplugin.allocation.idsets import id_index
from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind


class Ledger:
    """Free device IDs per (resource, GPU), as last told by the kubelet."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._free: dict[Kind, dict[str, set[str]]] = {
            kind: {uuid: set(ids) for uuid, ids in id_index(node, kind).per_gpu} for kind in Kind
        }

    def observe_available(self, kind: Kind, available: Mapping[str, set[str]]) -> None:
        """The kubelet's `available` set for `kind` (grouped by GPU, owned by the ledger from now on) replaces
        what we knew."""
        self._free[kind] = {g.uuid: available.get(g.uuid) or set() for g in self._node.gpus}

    def take(self, kind: Kind, uuid: str, ids: Iterable[str]) -> None:
        self._free[kind][uuid].difference_update(ids)

    def mark_allocated(self, kind: Kind, allocated: Mapping[str, Iterable[str]]) -> None:
        """Devices the kubelet already gave to containers (from PodResources after a restart)."""
        for uuid, units in allocated.items():
            if uuid in self._free[kind]:
                self._free[kind][uuid].difference_update(units)

    def free(self, kind: Kind, uuid: str) -> int:
        return len(self._free[kind][uuid])

    def untouched(self, uuid: str) -> bool:
        """No shared (gpu-mem / gpu-core) unit of this GPU is in use."""
        return all(self.free(k, uuid) == self._node.units(uuid, k) for k in (Kind.MEM, Kind.CORE))

    def held_whole(self, uuid: str) -> bool:
        """The GPU is given whole to a container through gpu-count."""
        return self.free(Kind.COUNT, uuid) == 0
