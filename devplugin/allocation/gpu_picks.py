"""Which GPU a container's share lands on: binpack (least room that fits) or spread (most room)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from devplugin.allocation.node import Node
from devplugin.allocation.topology import choose_on
from devplugin.allocation.units import Kind

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

T = TypeVar("T")
C = TypeVar("C", bound="SupportsRichComparison")  # units compared as they are, when no key is given


def pick_gpu(node: Node, room: Mapping[str, int], need: int, policy: str) -> str | None:
    """The UUID of the GPU to use for `need` units given free `room` per GPU, or None if none fits.

    binpack fills the fullest GPU that still fits (least free units, then lowest index);
    spread takes the emptiest (most free units, then lowest index). Only GPUs in `room` are considered.
    """
    fits = [(free, node.by_uuid[uuid].index, uuid) for uuid, free in room.items() if free >= need]
    if not fits:
        return None
    if policy == "spread":
        return min(fits, key=lambda t: (-t[0], t[1]))[2]
    return min(fits, key=lambda t: (t[0], t[1]))[2]


@overload
def pick_units(free: Collection[C], must: Collection[C], need: int, key: None = None) -> list[C]: ...
@overload
def pick_units(free: Collection[T], must: Collection[T], need: int, key: Callable[[T], int]) -> list[T]: ...
def pick_units(free: Collection[Any], must: Collection[Any], need: int,
               key: Callable[[Any], int] | None = None) -> list[Any]:
    """`need` units from `free`: all of `must` first, then the lowest free ones (by `key`, e.g. unit number)."""
    chosen = sorted(must, key=key)
    rest = set(free).difference(chosen)
    return chosen + heapq.nsmallest(max(need - len(chosen), 0), rest, key=key)


def pick_whole_gpus(node: Node, candidates: Sequence[str], must: Sequence[str], need: int) -> list[str] | None:
    """`need` whole GPUs: those in `must`, then the closest to them (one NVLink island, one NUMA node: topology.py)
    by index."""
    chosen = choose_on(node, [*candidates, *(u for u in must if u not in candidates)], need, lambda u: 0, must)
    return list(chosen.picked) if chosen is not None else None


class RecentShares:
    """What recent containers asked for, per resource: the room to keep for a container's other half."""

    def __init__(self, minimum: Mapping[Kind, int], history: int = 64) -> None:
        self._minimum = dict(minimum)
        self._seen: dict[Kind, deque[int]] = {k: deque(maxlen=history) for k in minimum}

    def add(self, kind: Kind, amount: int) -> None:
        self._seen[kind].append(amount)

    def reserve(self, kind: Kind) -> int:
        """The largest recent request of `kind` (at least the minimum share)."""
        return max(self._seen[kind], default=self._minimum[kind])

    def covered(self, kind: Kind, room: int) -> int:
        """How many recent requests of `kind` `room` units would hold (the minimum share stands in for none)."""
        seen = self._seen[kind] or (self._minimum[kind],)
        return sum(1 for n in seen if n <= room)
