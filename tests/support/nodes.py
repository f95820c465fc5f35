"""Test helpers: simulated nodes and a minimal in-process stand-in for the kubelet's device accounting."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.node import Node
from devplugin.allocation.ports import Grant
from devplugin.allocation.units import Kind, MemUnit, device_ids
from devplugin.gpu.device import GPU

GiB = 1 << 30


def make_gpus(sizes_gib: list[float]) -> tuple[GPU, ...]:
    return tuple(
        GPU(index=i, uuid=f"GPU-{i:08x}-1111-2222-3333-{i:012x}", name="NVIDIA Test", memory_bytes=int(s * GiB),
            minor=i, pci_bus_id=f"00000000:{i + 1:02x}:00.0", numa_node=i // 4)
        for i, s in enumerate(sizes_gib)
    )


def make_node(sizes_gib: list[float] | None = None, mode: str = "core_mem", placement: str = "binpack",
              unit_mib: int = 1024) -> Node:
    return Node(gpus=make_gpus(sizes_gib or [15] * 4), mode=mode, placement=placement, unit=MemUnit(unit_mib))


@dataclass
class MiniKubelet:
    """The kubelet's accounting in miniature: available = all - allocated; GPA then Allocate per resource."""

    node: Node
    allocator: Allocator
    held: dict[Kind, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.all = {k: [i for g in self.node.gpus for i in device_ids(g, k, self.node.unit)] for k in self.node.kinds}
        self.held = {k: set() for k in self.node.kinds}

    def available(self, kind: Kind) -> list[str]:
        return [i for i in self.all[kind] if i not in self.held[kind]]

    def admit(self, request: dict[Kind, int], order: list[Kind] | None = None) -> dict[Kind, Grant]:
        self.pending: dict[Kind, Grant] = {}
        for kind in order or list(request):
            ids = self.allocator.preferred(kind, self.available(kind), [], request[kind])
            self.pending[kind] = self.allocator.allocate(kind, ids)
            self.held[kind].update(ids)
        return self.pending

    def rollback(self) -> None:
        """Release what the last, failed admission got (the kubelet does this for a rejected pod)."""
        self.release(self.pending)
        self.pending = {}

    def release(self, grants: dict[Kind, Grant]) -> None:
        for kind, grant in grants.items():
            self.held[kind].difference_update(grant.device_ids)


def shuffled(kinds: list[Kind], rng: random.Random) -> list[Kind]:
    out = list(kinds)
    rng.shuffle(out)
    return out
