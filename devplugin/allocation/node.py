"""The node as the daemon serves it: its GPUs, mode, placement policy, gpu-mem unit and resource domain."""

from __future__ import annotations

from dataclasses import dataclass, field

from devplugin.allocation.units import Kind, MemUnit, units_per_gpu
from devplugin.contract import MODES, PLACEMENTS
from devplugin.gpu.device import GPU

__all__ = ["MODES", "PLACEMENTS", "Node", "served_kinds"]
SERVED_KINDS = {
    "core_mem": (Kind.MEM, Kind.CORE, Kind.COUNT),
    "cgpu": (Kind.MEM, Kind.COUNT),
    "share": (Kind.MEM, Kind.COUNT),
}


def served_kinds(mode: str) -> tuple[Kind, ...]:
    """The resources a node in this mode serves; empty for modes this daemon does not serve."""
    return SERVED_KINDS.get(mode, ())


@dataclass(frozen=True)
class Node:
    """Everything placement and Allocate need to know about the node."""

    gpus: tuple[GPU, ...]
    mode: str = "core_mem"
    placement: str = "binpack"
    unit: MemUnit = MemUnit(1024)
    domain: str = "aliyun.com"
    whole_gpus: int = 0  # > 0: the last N GPUs (by index) are kept for gpu-count, the others for slices
    by_uuid: dict[str, GPU] = field(init=False, repr=False, compare=False)
    memo: dict = field(init=False, repr=False, compare=False)  # derived tables, built once (idsets.id_index)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not served: use one of {', '.join(MODES)}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} is not valid: use binpack or spread")
        object.__setattr__(self, "by_uuid", {g.uuid: g for g in self.gpus})
        object.__setattr__(self, "memo", {})
        if len(self.by_uuid) != len(self.gpus):
            raise ValueError("two GPUs report the same UUID; check the driver")
        if not 0 <= self.whole_gpus <= len(self.gpus):
            raise ValueError(f"{self.whole_gpus} GPUs kept whole, but the node has {len(self.gpus)}")

    def kept_whole(self, uuid: str) -> bool | None:
        """With GPUs kept for gpu-count (whole_gpus > 0): whether this one is (True) or serves slices (False);
        None when no GPU is kept."""
        if not self.whole_gpus:
            return None
        kept = sorted(self.gpus, key=lambda g: g.index)[-self.whole_gpus:]
        return any(g.uuid == uuid for g in kept)

    @property
    def kinds(self) -> tuple[Kind, ...]:
        return served_kinds(self.mode)

    def units(self, uuid: str, kind: Kind) -> int:
        return units_per_gpu(self.by_uuid[uuid], kind, self.unit)

    def resource_name(self, kind: Kind) -> str:
        return kind.resource_name(self.domain)

    def isolates_memory(self) -> bool:
        return self.mode in ("core_mem", "cgpu")

    def isolates_compute(self) -> bool:
        return self.mode == "core_mem"
