"""Which of the GPUs that could hold a multi-GPU container to take: NVLink first, then one NUMA node, then any.

One rule for the node daemon (container_placement.place, GetPreferredAllocation) and the scheduler extender (fit):
among the candidate GPUs (those that fit and may be used, chosen by the caller), take `need` GPUs of one NVLink
island when some island has that many; else of one NUMA node; else the best by the node's policy wherever they are.
Within a level the node's placement policy breaks ties: first the GPUs it ranks best (binpack: least room left,
spread: most; whole GPUs all rank alike), then, binpack, the group with the fewest candidates (a tight fit keeps the
larger islands whole for larger requests), spread the group with the most, then the lowest GPU index. Pure; the
texts name GPUs by index and say why for the GPUAssigned Event.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from devplugin.allocation.node import Node

K = TypeVar("K", bound=Hashable)  # a candidate: a GPU UUID (the daemon), a GPU's room (the extender)

NVLINK, NUMA, ANY = "nvlink", "numa", "any"


@dataclass(frozen=True)
class Where:
    """A GPU's place in the node's interconnect; None where it is not known."""

    island: int | None = None  # NVLink island
    numa: int | None = None  # NUMA node


@dataclass(frozen=True)
class Chosen(Generic[K]):
    """The GPUs taken (in index order), how close they are (NVLINK, NUMA, ANY) and why, for the Event ('' when
    there is nothing to say: one GPU, or a node that publishes no topology)."""

    picked: tuple[K, ...]
    level: str
    why: str


def choose(candidates: Sequence[K], need: int, where: Callable[[K], Where], index: Callable[[K], int],
           rank: Callable[[K], Any], policy: str = "binpack", must: Sequence[K] = ()) -> Chosen[K] | None:
    """`need` of `candidates` (all of `must` among them), closest first as the module says; None when fewer than
    `need` candidates (or a `must` that is not a candidate)."""
    pool = set(candidates)
    if len(pool) < need or any(m not in pool for m in must) or len(set(must)) > need:
        return None
    ranked = sorted(pool, key=lambda k: (rank(k), index(k)))
    if need <= 1:
        return Chosen(tuple(must) if must else tuple(ranked[:need]), ANY, "")
    wanted = list(dict.fromkeys(must))
    for level, attr in ((NVLINK, _island), (NUMA, _numa)):
        groups: dict[int, list[K]] = {}
        for k in ranked:
            value = attr(where(k))
            if value is not None:
                groups.setdefault(value, []).append(k)
        options = []
        for value, members in groups.items():
            taken = _fill(members, wanted, need)
            if taken is not None:
                size = len(members) if policy != "spread" else -len(members)
                options.append(((sorted(rank(k) for k in taken), size, min(index(k) for k in taken), value),
                                value, taken))
        if options:
            _, value, taken = min(options, key=lambda o: o[0])
            picked = tuple(sorted(taken, key=index))
            return Chosen(picked, level, _why(level, value, picked, ranked, need, where, index))
    taken = _fill(ranked, wanted, need)
    assert taken is not None  # enough candidates, every `must` among them
    picked = tuple(sorted(taken, key=index))
    return Chosen(picked, ANY, _why(ANY, None, picked, ranked, need, where, index))


def describe(picked: Sequence[K], where: Callable[[K], Where], index: Callable[[K], int]) -> str:
    """How close GPUs chosen elsewhere (a scheduler's choice) are: '' for one GPU or no topology known."""
    if len(picked) < 2:
        return ""
    places = [where(k) for k in picked]
    names = _names(picked, index)
    islands = {p.island for p in places}
    if len(islands) == 1 and None not in islands:
        return f"{names} share NVLink island {islands.pop()}"
    nodes = {p.numa for p in places}
    if len(nodes) == 1 and None not in nodes:
        return f"{names} share NUMA node {nodes.pop()}"
    if nodes - {None}:
        return f"{names} spread across NUMA nodes {_list(nodes)}"
    return ""


def _island(w: Where) -> int | None:
    return w.island


def _numa(w: Where) -> int | None:
    return w.numa


def _fill(members: Sequence[K], wanted: Sequence[K], need: int) -> list[K] | None:
    """`wanted` (all of them must be members) topped up with the first other members; None when short."""
    if any(m not in members for m in wanted):
        return None
    taken = list(wanted) + [k for k in members if k not in wanted][: need - len(wanted)]
    return taken if len(taken) == need else None


def _names(picked: Sequence[K], index: Callable[[K], int]) -> str:
    return "GPUs " + ",".join(str(i) for i in sorted(index(k) for k in picked))


def _list(values: set[int | None]) -> str:
    return ",".join(str(v) for v in sorted(v for v in values if v is not None))


def _why(level: str, value: int | None, picked: tuple[K, ...], ranked: Sequence[K], need: int,
         where: Callable[[K], Where], index: Callable[[K], int]) -> str:
    names = _names(picked, index)
    islands_known = any(where(k).island is not None for k in ranked)
    numa_known = any(where(k).numa is not None for k in ranked)
    if level == NVLINK:
        return f"{names} share NVLink island {value}"
    if level == NUMA:
        text = f"{names} share NUMA node {value}"
        return f"no NVLink island had {need} GPUs with room: {text}" if islands_known else text
    if not (islands_known or numa_known):
        return ""
    nodes = {where(k).numa for k in picked}
    held = "no NVLink island or NUMA node" if islands_known and numa_known else (
        "no NVLink island" if islands_known else "no NUMA node")
    spread = (f"{names} spread across NUMA nodes {_list(nodes)}" if len(nodes - {None}) > 1
              else f"{names} share no NVLink island or known NUMA node")
    return f"{held} had {need} GPUs with room: {spread}"


def where_on(node: Node) -> Callable[[str], Where]:
    """A GPU's place by UUID, from the node daemon's inventory."""
    def where(uuid: str) -> Where:
        gpu = node.by_uuid[uuid]
        return Where(gpu.nvlink_island, gpu.numa_node)
    return where


def choose_on(node: Node, candidates: Sequence[str], need: int, rank: Callable[[str], Any],
              must: Sequence[str] = ()) -> Chosen[str] | None:
    """choose() over GPU UUIDs of the node daemon's node, by its placement policy."""
    return choose(candidates, need, where_on(node), lambda u: node.by_uuid[u].index, rank, node.placement, must)


def describe_on(node: Node, uuids: Sequence[str]) -> str:
    """describe() for GPU UUIDs of the node daemon's node."""
    return describe(uuids, where_on(node), lambda u: node.by_uuid[u].index)
