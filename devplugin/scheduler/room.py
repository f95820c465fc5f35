"""Room on each GPU of a node as the extender counts it: the node's inventory, minus what pods hold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from devplugin.contract import CORE_PER_GPU, GpuShare, NodeInventory, NodeUsage


@dataclass(slots=True)
class GpuRoom:
    """One GPU: its size and what is held on it (gpu-mem units, core percent, containers, held whole)."""

    index: int
    uuid: str
    mem_total: int
    healthy: bool = True
    mem_used: int = 0
    core_used: int = 0
    containers: int = 0
    whole: bool = False
    island: int | None = None  # NVLink island (the inventory's), None: none / not known
    numa: int | None = None  # NUMA node, None: not known

    @property
    def mem_free(self) -> int:
        return 0 if self.whole else max(self.mem_total - self.mem_used, 0)

    @property
    def core_free(self) -> int:
        return 0 if self.whole else max(CORE_PER_GPU - self.core_used, 0)

    @property
    def mem_allocated(self) -> int:
        """gpu-mem units counted as held (all of it when held whole; never more than the GPU has)."""
        return self.mem_total if self.whole else min(self.mem_used, self.mem_total)

    @property
    def core_allocated(self) -> int:
        """Compute percent counted as held (all of it when held whole; at most CORE_PER_GPU)."""
        return CORE_PER_GPU if self.whole else min(self.core_used, CORE_PER_GPU)

    @property
    def untouched(self) -> bool:
        """Nothing on it: it can be given whole."""
        return not (self.mem_used or self.core_used or self.containers or self.whole)

    def hold(self, share: GpuShare) -> None:
        if share.whole:
            self.whole = True
        self.mem_used += share.mem
        self.core_used += share.core
        self.containers += 1

    def copy(self) -> GpuRoom:
        return GpuRoom(self.index, self.uuid, self.mem_total, self.healthy, self.mem_used, self.core_used,
                       self.containers, self.whole, self.island, self.numa)


def node_room(inventory: NodeInventory, holdings: Iterable[Mapping[str, tuple[GpuShare, ...]]],
              usage: NodeUsage | None = None,
              removed: Iterable[Mapping[str, tuple[GpuShare, ...]]] = ()) -> tuple[GpuRoom, ...]:
    """Per-GPU room: the inventory, minus every share in `holdings` (one mapping per pod: container -> shares: the
    pods the node daemon's `usage` does not count yet, or every pod when the node publishes no usage), minus the
    daemon's usage less the shares of the pods in `removed` (pods left out of this view that the usage counts)."""
    rooms = {g.index: GpuRoom(g.index, g.uuid, g.mem_units, g.healthy, island=g.nvlink_island, numa=g.numa_node)
             for g in inventory.gpus}
    for pod in holdings:
        for shares in pod.values():
            for share in shares:
                room = rooms.get(share.index)
                if room is not None:
                    room.hold(share)
    if usage is not None:
        gone = {i: GpuRoom(i, "", 0) for i in rooms}
        for pod in removed:
            for shares in pod.values():
                for share in shares:
                    if share.index in gone:
                        gone[share.index].hold(share)
        for index, used in usage.gpus.items():
            room = rooms.get(index)
            if room is None:
                continue
            minus = gone[index]
            room.mem_used += max(used.mem - minus.mem_used, 0)
            room.core_used += max(used.core - minus.core_used, 0)
            room.containers += max(used.containers - minus.containers, 0)
            room.whole = room.whole or (used.whole and not minus.whole)
    return tuple(rooms[i] for i in sorted(rooms))


def mem_text(amount: int, unit_mib: int) -> str:
    """`15 GiB`, `300 MiB`, or `6 x 512 MiB` for other unit sizes."""
    if unit_mib == 1024:
        return f"{amount} GiB"
    if unit_mib == 1:
        return f"{amount} MiB"
    return f"{amount} x {unit_mib} MiB"


def gpu_list(indices: Iterable[int]) -> str:
    """`GPU 0..3`, `GPU 0,2,5`, `GPU 4`; `no GPU` when empty."""
    idx = sorted(indices)
    if not idx:
        return "no GPU"
    if len(idx) > 2 and idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPU {idx[0]}..{idx[-1]}"
    return "GPU " + ",".join(map(str, idx))
