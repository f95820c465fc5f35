"""Place a whole container at once: the GPU(s) that hold all of its gpu-mem, gpu-core.percentage or gpu-count.

A scheduler's choice is honoured when the chosen GPUs have room; otherwise the node's policy (binpack: the fullest
GPUs that fit; spread: the emptiest) decides and the caller reports the override. Pure: room comes from the node
view (holdings) and, for the resource being called, from the kubelet's own `available` IDs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from devplugin.allocation.errors import NoRoom
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.node import Node
from devplugin.allocation.scheduler_choice import Choice
from devplugin.allocation.topology import choose_on, describe_on
from devplugin.allocation.units import Kind
from devplugin.allocation.unreserved import advice


@dataclass(frozen=True)
class Need:
    """What a container needs on each of its GPUs."""

    per_gpu: Mapping[Kind, int]  # gpu-mem and gpu-core.percentage units on each GPU (shared containers)
    gpus: int = 1
    whole: bool = False  # gpu-count: whole GPUs, nothing else on them
    # compute percent that must be unreserved on each GPU without being reserved: a container that reserves no
    # compute on a core_mem node runs only on compute nobody reserved (unreserved.py)
    unreserved: int = 0


@dataclass(frozen=True)
class Placement:
    gpus: tuple[str, ...]
    source: str  # the annotation honoured, or the policy
    override: str = ""  # why a scheduler's choice was not honoured ("" when it was, or there was none)


class Room:
    """Free units per (resource, GPU): the kubelet's `available` for the resource being called, the node view for
    the others; GPUs that are unhealthy, or held in the other way (whole vs shared), have none."""

    def __init__(self, node: Node, holdings: Holdings, healthy: Callable[[str], bool],
                 called: Kind | None = None, available: Mapping[str, set[str]] | None = None,
                 excluded: Mapping[str, str] | None = None) -> None:
        self.node = node
        self.holdings = holdings
        self.healthy = healthy
        self.called = called
        self.available = available
        self.excluded = excluded or {}  # GPUs the pod's selection excludes: uuid -> why (selected_gpus.py)

    def free(self, kind: Kind, uuid: str) -> int:
        if kind is self.called and self.available is not None:
            return len(self.available.get(uuid, ()))
        return self.holdings.free(kind, uuid)

    def fits(self, uuid: str, need: Need) -> bool:
        if uuid in self.excluded or not self.healthy(uuid) or self.holdings.whole(uuid):
            return False
        kept = self.node.kept_whole(uuid)
        if kept is not None and kept != need.whole:
            return False
        if need.whole:
            return not self.holdings.shared(uuid) and self.free(Kind.COUNT, uuid) > 0
        if need.unreserved and self.free(Kind.CORE, uuid) < need.unreserved:
            return False
        return all(self.free(kind, uuid) >= n for kind, n in need.per_gpu.items() if n)

    def describe(self, uuid: str) -> str:
        gpu = self.node.by_uuid[uuid]
        if uuid in self.excluded:
            return f"GPU {gpu.index}: excluded by the pod's GPU selection ({self.excluded[uuid]})"
        if not self.healthy(uuid):
            return f"GPU {gpu.index}: unhealthy"
        if self.holdings.whole(uuid):
            return f"GPU {gpu.index}: held whole"
        parts = [f"{self.free(Kind.MEM, uuid)} {self.node.unit.name} free"]
        if Kind.CORE in self.node.kinds:
            parts.append(f"{self.free(Kind.CORE, uuid)} % core free")
        return f"GPU {gpu.index}: " + ", ".join(parts)


def describe_need(node: Node, need: Need) -> str:
    if need.whole:
        return f"{need.gpus} whole GPU(s) with no shared containers"
    parts = []
    if need.per_gpu.get(Kind.MEM):
        parts.append(f"{need.per_gpu[Kind.MEM]} {node.unit.name}")
    if need.per_gpu.get(Kind.CORE):
        parts.append(f"{need.per_gpu[Kind.CORE]} % core")
    if need.unreserved:
        parts.append(f"at least {need.unreserved} % core nobody reserved")
    what = " and ".join(parts) or "a share"
    return f"{what} on each of {need.gpus} GPUs" if need.gpus > 1 else f"{what} on one GPU"


def place(room: Room, need: Need, choice: Choice | None = None) -> Placement:
    """The GPUs for this container; NoRoom naming what was asked and each GPU's room."""
    node = room.node
    override = ""
    if choice is not None:
        fit = [u for u in choice.gpus if room.fits(u, need)]
        if len(choice.gpus) == need.gpus and len(fit) == need.gpus:
            how = describe_on(node, choice.gpus)
            return Placement(choice.gpus, choice.source + (f"; {how}" if how else ""))
        bad = [u for u in choice.gpus if u not in fit] or list(choice.gpus)
        override = (f"the scheduler chose {', '.join(f'GPU {node.by_uuid[u].index} ({u})' for u in choice.gpus)} "
                    f"({choice.source}) but {room.describe(bad[0])}, and the container needs "
                    f"{describe_need(node, need)}")
    fits = [g.uuid for g in node.gpus if room.fits(g.uuid, need)]
    if len(fits) < need.gpus:
        detail = "; ".join(room.describe(g.uuid) for g in node.gpus)
        if need.unreserved and len([g for g in node.gpus if room.fits(g.uuid, replace(need, unreserved=0))]) \
                >= need.gpus:
            raise NoRoom(f"no GPU of this node has room for {describe_need(node, need)} ({detail}): "
                         + advice(node.resource_name(Kind.CORE)), reason="no_unreserved_compute")
        raise NoRoom(f"no GPU of this node has room for {describe_need(node, need)} ({detail}); "
                     "lower the request or wait for running pods to end")
    key_kind = Kind.MEM if need.per_gpu.get(Kind.MEM) else Kind.CORE
    sign = -1 if node.placement == "spread" else 1
    rank = (lambda u: 0) if need.whole else (lambda u: sign * room.free(key_kind, u))  # whole GPUs: all alike
    chosen = choose_on(node, fits, need.gpus, rank)
    assert chosen is not None  # enough candidates were checked above
    gpus = chosen.picked
    chosen_txt = ", ".join(f"GPU {node.by_uuid[u].index} ({u})" for u in gpus)
    if override:
        override += f"; placed on {chosen_txt} by the node's {node.placement} policy instead"
    return Placement(gpus, f"{node.placement} policy" + (f"; {chosen.why}" if chosen.why else ""), override)


def plan_together(room: Room, needs: Sequence[Need], budget: int = 20_000) -> list[tuple[str, ...]] | None:
    """One GPU for each of a pod's shared one-GPU containers such that all of them fit at once (the first need is
    the container being admitted), each by the node's policy where there is a choice; None when there is no such
    plan within `budget` steps (or a need is not a shared one-GPU share)."""
    node = room.node
    if any(n.whole or n.gpus != 1 for n in needs):
        return None
    uuids = [g.uuid for g in node.gpus
             if room.healthy(g.uuid) and not room.holdings.whole(g.uuid) and g.uuid not in room.excluded]
    free = {(k, u): room.free(k, u) for u in uuids for k in (Kind.MEM, Kind.CORE)}
    sign = -1 if node.placement == "spread" else 1
    steps = 0
    chosen: list[str] = []

    def search(i: int) -> bool:
        nonlocal steps
        if i == len(needs):
            return True
        need = needs[i]
        key_kind = Kind.MEM if need.per_gpu.get(Kind.MEM) else Kind.CORE
        fits = [u for u in uuids if all(free[(k, u)] >= n for k, n in need.per_gpu.items() if n)
                and free[(Kind.CORE, u)] >= need.unreserved]
        fits.sort(key=lambda u: (sign * free[(key_kind, u)], node.by_uuid[u].index))
        for u in fits:
            steps += 1
            if steps > budget:
                return False
            for k, n in need.per_gpu.items():
                free[(k, u)] -= n
            chosen.append(u)
            if search(i + 1):
                return True
            chosen.pop()
            for k, n in need.per_gpu.items():
                free[(k, u)] += n
        return False

    return [(u,) for u in chosen] if search(0) else None
