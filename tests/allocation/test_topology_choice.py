"""Multi-GPU placement prefers one NVLink island, then one NUMA node, then anything, with the node's policy as the
tie-breaker; always a valid placement, never worse than first-fit in island locality, never on a GPU that may not
be used. The rule (devplugin/allocation/topology.py) and the node daemon's use of it (container_placement.place and
GetPreferredAllocation for whole GPUs)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.container_placement import Need, Room, place
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.node import Node
from devplugin.allocation.topology import ANY, NUMA, NVLINK, Where, choose, describe
from devplugin.allocation.units import Kind, MemUnit, decode_id, encode_id
from devplugin.gpu.device import GPU
from tests.support.nodes import MiniKubelet

GiB = 1 << 30


def islands_node(placement: str = "binpack", islands: tuple[int | None, ...] = (0, 0, 0, 0, 1, 1, 1, 1),
                 numa: tuple[int | None, ...] = (0, 0, 0, 0, 1, 1, 1, 1)) -> Node:
    gpus = tuple(GPU(index=i, uuid=f"GPU-{i}", name="A100", memory_bytes=80 * GiB, minor=i,
                     pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=numa[i], nvlink_island=islands[i])
                 for i in range(len(islands)))
    return Node(gpus=gpus, placement=placement, unit=MemUnit(1024))


def whole(node: Node, free: set[int], gpus: int = 2, healthy: set[int] | None = None):
    """place() for `gpus` whole GPUs when only the GPUs `free` (indexes) are offered by the kubelet."""
    avail = {f"GPU-{i}": {f"GPU-{i}-count"} for i in free}
    ok = healthy if healthy is not None else set(range(len(node.gpus)))
    room = Room(node, Holdings(node), lambda u: node.by_uuid[u].index in ok, Kind.COUNT, avail)
    return place(room, Need(per_gpu={}, gpus=gpus, whole=True))


def indexes(node: Node, uuids) -> list[int]:
    return [node.by_uuid[u].index for u in uuids]


def test_two_whole_gpus_land_in_the_island_they_fill_best_and_the_event_says_so() -> None:
    node = islands_node()
    placed = whole(node, free={2, 3, 5, 6, 7})  # island 0 has 2 free, island 1 has 3
    assert indexes(node, placed.gpus) == [2, 3]
    assert placed.source == "binpack policy; GPUs 2,3 share NVLink island 0"


def test_spread_takes_the_island_with_most_room() -> None:
    node = islands_node(placement="spread")
    placed = whole(node, free={2, 3, 5, 6, 7})
    assert indexes(node, placed.gpus) == [5, 6]
    assert placed.source == "spread policy; GPUs 5,6 share NVLink island 1"


def test_without_an_island_with_room_the_same_numa_node_is_taken() -> None:
    node = islands_node(islands=(0, 0, 1, 1, 2, 2, 3, 3))
    placed = whole(node, free={1, 3, 4, 6})  # each island has one free GPU; NUMA 0: 1,3; NUMA 1: 4,6
    assert indexes(node, placed.gpus) == [1, 3]
    assert placed.source == "binpack policy; no NVLink island had 2 GPUs with room: GPUs 1,3 share NUMA node 0"


def test_otherwise_the_gpus_spread_across_numa_nodes_and_the_event_says_so() -> None:
    node = islands_node()
    placed = whole(node, free={3, 4}, gpus=2)
    assert indexes(node, placed.gpus) == [3, 4]
    assert placed.source == ("binpack policy; no NVLink island or NUMA node had 2 GPUs with room: GPUs 3,4 spread "
                             "across NUMA nodes 0,1")


def test_an_unhealthy_gpu_of_the_island_is_never_taken() -> None:
    node = islands_node()
    placed = whole(node, free={0, 1, 2, 3, 5, 6, 7}, gpus=3, healthy={0, 1, 3, 4, 5, 6, 7})  # GPU 2 is sick
    assert indexes(node, placed.gpus) == [0, 1, 3]
    assert placed.source == "binpack policy; GPUs 0,1,3 share NVLink island 0"


def test_two_gpu_shares_land_in_one_island_too() -> None:
    node = islands_node()
    holdings = Holdings(node)
    room = Room(node, holdings, lambda u: True)
    # island 0's GPUs have 20 GiB free each, island 1's 80: binpack takes the fuller island for 2 x 10 GiB
    mem = {f"GPU-{i}": (20 if i < 4 else 80) for i in range(8)}
    room.free = lambda kind, uuid: mem[uuid] if kind is Kind.MEM else 100  # type: ignore[method-assign]
    placed = place(room, Need(per_gpu={Kind.MEM: 10, Kind.CORE: 0}, gpus=2))
    assert indexes(node, placed.gpus) == [0, 1]
    assert placed.source == "binpack policy; GPUs 0,1 share NVLink island 0"


def test_a_scheduler_choice_is_honoured_and_explained() -> None:
    from devplugin.allocation.scheduler_choice import Choice

    node = islands_node()
    room = Room(node, Holdings(node), lambda u: True, Kind.COUNT, {f"GPU-{i}": {"x"} for i in range(8)})
    placed = place(room, Need(per_gpu={}, gpus=2, whole=True), Choice(("GPU-4", "GPU-5"), "gpushare.io/scheduled"))
    assert placed.source == "gpushare.io/scheduled; GPUs 4,5 share NVLink island 1"


def test_a_node_without_topology_places_as_before_and_says_nothing_more() -> None:
    node = islands_node(islands=(None,) * 4, numa=(None,) * 4)
    placed = whole(node, free={1, 2, 3})
    assert indexes(node, placed.gpus) == [1, 2]
    assert placed.source == "binpack policy"


def test_get_preferred_allocation_without_pod_lookup_prefers_the_island() -> None:
    node = islands_node()
    kubelet = MiniKubelet(node, Allocator(node, pair_window_s=60))
    held = {encode_id(f"GPU-{i}", Kind.COUNT) for i in (0, 1, 4)}  # held by other pods
    kubelet.held[Kind.COUNT].update(held)
    ids = kubelet.allocator.preferred(Kind.COUNT, kubelet.available(Kind.COUNT), [], 2)
    assert sorted(node.by_uuid[decode_id(i)[0]].index for i in ids) == [2, 3]
    must = kubelet.allocator.preferred(Kind.COUNT, kubelet.available(Kind.COUNT), [encode_id("GPU-6", Kind.COUNT)], 2)
    assert sorted(node.by_uuid[decode_id(i)[0]].index for i in must) == [5, 6]


def test_must_include_is_kept_and_topped_up_from_its_island() -> None:
    where = {i: Where(i // 4, i // 4) for i in range(8)}
    chosen = choose(list(range(8)), 3, where.__getitem__, lambda i: i, lambda i: 0, must=[5])
    assert chosen is not None and chosen.picked == (4, 5, 6) and chosen.level == NVLINK


def test_describe() -> None:
    where = {0: Where(0, 0), 1: Where(0, 0), 2: Where(None, 0), 3: Where(None, 1), 4: Where()}
    assert describe([0, 1], where.__getitem__, lambda i: i) == "GPUs 0,1 share NVLink island 0"
    assert describe([1, 2], where.__getitem__, lambda i: i) == "GPUs 1,2 share NUMA node 0"
    assert describe([2, 3], where.__getitem__, lambda i: i) == "GPUs 2,3 spread across NUMA nodes 0,1"
    assert describe([4, 4], where.__getitem__, lambda i: i) == ""
    assert describe([0], where.__getitem__, lambda i: i) == ""


# --- properties ------------------------------------------------------------------------------------------------
layouts = st.integers(2, 16).flatmap(lambda n: st.tuples(
    st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=n, max_size=n),
    st.lists(st.one_of(st.none(), st.integers(0, 1)), min_size=n, max_size=n),
    st.lists(st.integers(0, 5), min_size=n, max_size=n),  # the policy's rank of each GPU (room left)
    st.lists(st.booleans(), min_size=n, max_size=n),  # a candidate (fits and may be used)?
))


def one_island(picked, where) -> bool:
    isl = {where(k).island for k in picked}
    return len(isl) == 1 and None not in isl


@settings(max_examples=400, deadline=None)
@given(layouts, st.integers(1, 6), st.sampled_from(["binpack", "spread"]))
def test_always_valid_and_never_less_local_than_first_fit(layout, need, policy) -> None:
    islands, numa, ranks, usable = layout
    where = [Where(i, n) for i, n in zip(islands, numa, strict=True)]
    candidates = [k for k, ok in enumerate(usable) if ok]
    chosen = choose(candidates, need, where.__getitem__, lambda k: k, ranks.__getitem__, policy)
    if len(candidates) < need:
        assert chosen is None
        return
    assert chosen is not None
    picked = chosen.picked
    assert len(picked) == need and len(set(picked)) == need
    assert set(picked) <= set(candidates)  # never a GPU that does not fit or may not be used
    assert list(picked) == sorted(picked)
    first_fit = sorted(candidates, key=lambda k: (ranks[k], k))[:need]
    if need > 1 and one_island(first_fit, where.__getitem__):
        assert one_island(picked, where.__getitem__)
    if need > 1:
        by_island: dict[int, int] = {}
        by_numa: dict[int, int] = {}
        for k in candidates:
            if where[k].island is not None:
                by_island[where[k].island] = by_island.get(where[k].island, 0) + 1
            if where[k].numa is not None:
                by_numa[where[k].numa] = by_numa.get(where[k].numa, 0) + 1
        some_island = any(n >= need for n in by_island.values())
        some_numa = any(n >= need for n in by_numa.values())
        assert chosen.level == (NVLINK if some_island else NUMA if some_numa else ANY)
        if chosen.level == NVLINK:
            assert one_island(picked, where.__getitem__)
        if chosen.level == NUMA:
            assert len({where[k].numa for k in picked}) == 1


@settings(max_examples=200, deadline=None)
@given(layouts, st.integers(2, 6), st.data())
def test_must_include_is_always_kept(layout, need, data) -> None:
    islands, numa, ranks, _ = layout
    where = [Where(i, n) for i, n in zip(islands, numa, strict=True)]
    candidates = list(range(len(islands)))
    if need > len(candidates):
        return
    must = data.draw(st.lists(st.sampled_from(candidates), max_size=need, unique=True))
    chosen = choose(candidates, need, where.__getitem__, lambda k: k, ranks.__getitem__, must=must)
    assert chosen is not None
    assert set(must) <= set(chosen.picked) and len(chosen.picked) == need
