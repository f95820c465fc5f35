"""Binpack fills one GPU first, spread takes the emptiest, and a container's mem and core share one GPU."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.errors import NoRoom, PairingConflict
from devplugin.allocation.gpu_picks import pick_gpu, pick_units
from devplugin.allocation.units import Kind
from tests.support.nodes import MiniKubelet, make_node, shuffled

MEM, CORE, COUNT = Kind.MEM, Kind.CORE, Kind.COUNT


def kubelet(**kw) -> MiniKubelet:
    node = make_node(**kw)
    return MiniKubelet(node, Allocator(node, pair_window_s=60))


def gpu_index(k: MiniKubelet, grant) -> int:
    return k.node.by_uuid[grant.gpus[0]].index


def test_binpack_fills_a_4_gpu_node_to_the_last_unit() -> None:
    k = kubelet(placement="binpack")
    order = []
    for _ in range(4 * 15):  # 60 x 1 GiB, 5 % each would be 300 % so use mem-only cgpu semantics below
        grants = k.admit({MEM: 1, CORE: 5})
        order.append(gpu_index(k, grants[MEM]))
        assert grants[MEM].gpus == grants[CORE].gpus
    assert order == [0] * 15 + [1] * 15 + [2] * 15 + [3] * 15
    assert k.available(MEM) == []
    with pytest.raises(NoRoom, match="1 requested but only 0 available"):
        k.admit({MEM: 1, CORE: 5})


def test_spread_takes_the_emptiest_gpu_and_still_fills_every_unit() -> None:
    k = kubelet(placement="spread")
    first = [gpu_index(k, k.admit({MEM: 2, CORE: 10})[MEM]) for _ in range(4)]
    assert first == [0, 1, 2, 3]
    for _ in range(4 * 15 - 8):
        k.admit({MEM: 1, CORE: 5})
    assert k.available(MEM) == []


def test_binpack_prefers_the_fullest_gpu_that_fits() -> None:
    k = kubelet(placement="binpack")
    a = k.admit({MEM: 10, CORE: 10})  # GPU0: 5 left
    b = k.admit({MEM: 6, CORE: 10})  # does not fit GPU0 -> GPU1: 9 left
    c = k.admit({MEM: 5, CORE: 10})  # fits GPU0 exactly (5) and GPU1 (9): binpack takes GPU0
    assert [gpu_index(k, g[MEM]) for g in (a, b, c)] == [0, 1, 0]


def test_a_gpu_without_compute_left_is_not_chosen_for_memory() -> None:
    k = kubelet(placement="binpack")
    k.admit({MEM: 1, CORE: 100})  # GPU0's compute is gone, memory is not
    grants = k.admit({MEM: 1, CORE: 5}, order=[MEM, CORE])
    assert gpu_index(k, grants[MEM]) == 1 == gpu_index(k, grants[CORE])


def test_memory_first_keeps_room_for_compute_like_recent_containers() -> None:
    k = kubelet(placement="binpack")
    for _ in range(3):
        k.admit({MEM: 1, CORE: 30}, order=[CORE, MEM])  # GPU0: 10 % compute left, 12 GiB memory
    grants = k.admit({MEM: 1, CORE: 30}, order=[MEM, CORE])  # memory first: GPU0 would strand the compute
    assert gpu_index(k, grants[MEM]) == 1 == gpu_index(k, grants[CORE])


def test_mixed_sizes_place_by_each_gpus_own_room() -> None:
    k = kubelet(sizes_gib=[80, 24], placement="binpack")
    assert gpu_index(k, k.admit({MEM: 20, CORE: 5})[MEM]) == 1  # 24 GiB GPU is the tighter fit
    assert gpu_index(k, k.admit({MEM: 30, CORE: 5})[MEM]) == 0  # only the 80 GiB GPU fits
    with pytest.raises(NoRoom, match="no single GPU has 51 free units"):
        k.admit({MEM: 51, CORE: 5})


def test_whole_gpus_avoid_shared_ones_and_shares_avoid_whole_ones() -> None:
    k = kubelet(placement="binpack")
    k.admit({MEM: 1, CORE: 5})  # GPU0 shared
    whole = k.admit({COUNT: 2})[COUNT]
    assert sorted(k.node.by_uuid[u].index for u in whole.gpus) == [1, 2]
    share = k.admit({MEM: 1, CORE: 5})
    assert gpu_index(k, share[MEM]) == 0
    for _ in range(14):
        k.admit({MEM: 1, CORE: 5})
    assert gpu_index(k, k.admit({MEM: 1, CORE: 5})[MEM]) == 3  # GPU0 full, 1 and 2 held whole


def test_must_include_is_honoured() -> None:
    k = kubelet()
    avail = k.available(MEM)
    must = [i for i in avail if "-000000000002::" in i][:2]
    ids = k.allocator.preferred(MEM, avail, must, 4)
    assert ids[:2] == must and len(ids) == 4 and all("-000000000002::" in i for i in ids)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), placement=st.sampled_from(["binpack", "spread"]))
def test_mem_and_core_share_a_gpu_over_200_random_admissions(seed: int, placement: str) -> None:
    rng = random.Random(seed)
    k = kubelet(placement=placement, sizes_gib=[15, 15, 24, 40])
    live = []
    for _ in range(200):
        if live and (rng.random() < 0.4):
            k.release(live.pop(rng.randrange(len(live))))
        request = {MEM: rng.randint(1, 6), CORE: rng.choice(range(5, 55, 5))}
        try:
            grants = k.admit(request, order=shuffled([MEM, CORE], rng))
        except (NoRoom, PairingConflict):
            # refused: the kubelet rolls the pod back and moves on (the first half's devices are released)
            k.rollback()
            continue
        assert grants[MEM].gpus == grants[CORE].gpus
        assert grants[MEM].envs["NVIDIA_VISIBLE_DEVICES"] == grants[CORE].envs["NVIDIA_VISIBLE_DEVICES"]
        live.append(grants)


def test_pick_gpu_policies() -> None:
    node = make_node()
    uuids = [g.uuid for g in node.gpus]
    room = {uuids[0]: 3, uuids[1]: 9, uuids[2]: 5, uuids[3]: 1}
    assert pick_gpu(node, room, 2, "binpack") == uuids[0]
    assert pick_gpu(node, room, 2, "spread") == uuids[1]
    assert pick_gpu(node, room, 10, "binpack") is None
    assert pick_units([5, 1, 3, 2], [3], 3) == [3, 1, 2]
