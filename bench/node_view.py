"""Held devices per GPU, from the kubelet's view (its allocations) or from the daemon's (its holdings), and the
questions bench/churn.py asks of them: had some GPU room for this container, is any GPU given twice."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.common import CORE, COUNT, MEM
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.units import CORE_UNITS_PER_GPU, Kind, decode_id

KIND_RESOURCE = {Kind.MEM: MEM, Kind.CORE: CORE, Kind.COUNT: COUNT}


@dataclass
class GpuUse:
    mem: int = 0
    core: int = 0
    whole: set[str] = field(default_factory=set)  # holders of the GPU whole
    shared: set[str] = field(default_factory=set)  # holders of units of it

    @property
    def idle(self) -> bool:
        return not self.whole and not self.shared


@dataclass
class View:
    """GPU UUID -> use; `ids` device ID -> holders (to find an ID given twice)."""

    gpus: dict[str, GpuUse] = field(default_factory=lambda: defaultdict(GpuUse))
    ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def add(self, holder: str, resource: str, dev_id: str) -> None:
        uuid = decode_id(dev_id)[0]
        use = self.gpus[uuid]
        self.ids[dev_id].add(holder)
        if resource == COUNT:
            use.whole.add(holder)
            return
        use.shared.add(holder)
        if resource == MEM:
            use.mem += 1
        elif resource == CORE:
            use.core += 1

    def double_allocations(self) -> list[str]:
        out = [f"device {i} held by {sorted(h)}" for i, h in self.ids.items() if len(h) > 1]
        for uuid, use in sorted(self.gpus.items()):
            if len(use.whole) > 1 or (use.whole and use.shared):
                out.append(f"{uuid} held whole by {sorted(use.whole)} and shared by {sorted(use.shared)}")
        return out

    def describe(self) -> str:
        parts = []
        for uuid, use in sorted(self.gpus.items(), key=lambda kv: kv[0]):
            if use.whole:
                parts.append(f"{uuid[-2:]}: whole")
            elif use.shared:
                parts.append(f"{uuid[-2:]}: {use.mem} GiB {use.core} %")
        return ", ".join(parts) or "nothing held"


def kubelet_view(allocations: Mapping[str, Mapping[str, Mapping[str, list[str]]]]) -> View:
    """From KubeletEmulator.allocations(): pod uid -> container -> resource -> IDs."""
    view = View()
    for uid, containers in allocations.items():
        for name, resources in containers.items():
            for resource, ids in resources.items():
                for dev_id in ids:
                    view.add(f"{uid}/{name}", resource, dev_id)
    return view


def view_of_holdings(holdings: Holdings, keep: set[str] | None = None) -> View:
    """The daemon's view; only holders in `keep` when given."""
    view = View()
    for h in holdings.holders():
        if keep is not None and h.holder not in keep:
            continue
        for kind, per_gpu in h.ids.items():
            for ids in per_gpu.values():
                for dev_id in ids:
                    view.add(h.holder, KIND_RESOURCE[kind], dev_id)
    return view


def room_for(view: View, limits: Mapping[str, int], gib_per_gpu: int, all_gpus: list[str]) -> bool:
    """Had the node room for this one-GPU share (or these whole GPUs)? `all_gpus`: every GPU UUID of the node
    (those the view does not name are idle)."""
    uses = [view.gpus.get(u, GpuUse()) for u in all_gpus]
    if limits.get(COUNT):
        return sum(1 for use in uses if use.idle) >= limits[COUNT]
    mem, core = limits.get(MEM, 0), limits.get(CORE, 0)
    return any(not use.whole and gib_per_gpu - use.mem >= mem and CORE_UNITS_PER_GPU - use.core >= core
               for use in uses)
