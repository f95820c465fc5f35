"""Property: random mixes of pods on 8 GPUs, admitted the way the kubelet does (each container's resources in
random order), with the pods known to the daemon: every container gets exactly what it asked for on one GPU (or its
N GPUs), no unit is given twice, and no container is refused while some GPU (or N GPUs) had room for all of it."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.errors import RequestError
from devplugin.allocation.requests import pod_request
from devplugin.allocation.units import Kind, decode_id
from tests.support.nodes import MiniKubelet, make_node

GPUS = 8
SIZE_GIB = 80
NAMES = {Kind.MEM: "aliyun.com/gpu-mem", Kind.CORE: "aliyun.com/gpu-core.percentage",
         Kind.COUNT: "aliyun.com/gpu-count"}


class Pods:
    """The pod cache stand-in: pods bound to the node, by UID."""

    def __init__(self) -> None:
        self.by_uid: dict[str, object] = {}

    def pods(self):  # type: ignore[no-untyped-def]
        return list(self.by_uid.values())

    def fetch_now(self, budget_s: float):  # type: ignore[no-untyped-def]
        return self.pods()


def make_pod(uid: str, request: dict[Kind, int], n: int, seq: int) -> object:
    limits = {NAMES[k]: str(v) for k, v in request.items() if v}
    labels = {"aliyun.com/gpu-count": str(n)} if n > 1 else {}
    return pod_request({"metadata": {"name": uid, "namespace": "default", "uid": uid, "labels": labels,
                                     "creationTimestamp": f"2026-11-23T{seq // 3600:02d}:{seq // 60 % 60:02d}:"
                                                          f"{seq % 60:02d}Z"},
                        "spec": {"nodeName": "n", "containers": [{"name": "main",
                                                                  "resources": {"limits": limits}}]}})


request_st = st.one_of(
    st.tuples(st.integers(1, 40), st.sampled_from([0] + list(range(5, 65, 5))), st.just(0), st.just(1)),
    st.tuples(st.integers(0, 0), st.sampled_from(list(range(5, 65, 5))), st.just(0), st.just(1)),  # core only
    st.tuples(st.just(0), st.just(0), st.integers(1, 2), st.just(1)),  # whole GPUs
    st.tuples(st.sampled_from([2, 4, 8, 16]), st.sampled_from([0, 10, 20, 40]), st.just(0), st.just(2)),  # 2-way
)
ops_st = st.lists(st.one_of(request_st, st.just("end")), min_size=10, max_size=60)


def room_for(k: MiniKubelet, request: dict[Kind, int], n: int) -> bool:
    """Could some GPU (or n GPUs) hold the whole container, by the kubelet's own books?"""
    node = k.node
    used: dict[str, dict[Kind, int]] = {g.uuid: {kind: 0 for kind in Kind} for g in node.gpus}
    for kind, ids in k.held.items():
        for i in ids:
            used[decode_id(i)[0]][kind] += 1
    fits = []
    for g in node.gpus:
        u = used[g.uuid]
        if u[Kind.COUNT]:
            continue
        if request.get(Kind.COUNT):
            if not u[Kind.MEM] and not u[Kind.CORE]:
                fits.append(g)
            continue
        mem, core = request.get(Kind.MEM, 0) // n, request.get(Kind.CORE, 0) // n
        if mem and not core and node.mode == "core_mem":
            core = 5  # it reserves no compute, but runs only where at least 5 % is unreserved (docs/guide/modes.md)
        if node.units(g.uuid, Kind.MEM) - u[Kind.MEM] >= mem and 100 - u[Kind.CORE] >= core:
            fits.append(g)
    return len(fits) >= (request.get(Kind.COUNT) or n)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_st, seed=st.integers(0, 2**32 - 1), placement=st.sampled_from(["binpack", "spread"]))
def test_every_container_gets_what_it_asked_on_its_gpus_and_nothing_twice(ops, seed, placement) -> None:
    rng = random.Random(seed)
    node = make_node([SIZE_GIB] * GPUS, placement=placement)
    pods = Pods()
    k = MiniKubelet(node, Allocator(node, pair_window_s=60, lookup=pods))
    live: dict[str, dict[Kind, list[str]]] = {}
    for seq, op in enumerate(ops):
        if op == "end":
            if live:
                uid = rng.choice(sorted(live))
                for kind, ids in live.pop(uid).items():
                    k.held[kind].difference_update(ids)
                del pods.by_uid[uid]
                k.allocator.pod_ended(uid)
            continue
        mem, core, count, n = op
        request = {kind: v for kind, v in ((Kind.MEM, mem), (Kind.CORE, core), (Kind.COUNT, count)) if v}
        uid = f"p{seq}"
        pods.by_uid[uid] = make_pod(uid, request, n, seq)
        had_room = room_for(k, request, n)
        core_free = {g.uuid: 100 - sum(1 for i in k.held[Kind.CORE] if decode_id(i)[0] == g.uuid) for g in node.gpus}
        order = list(request)
        rng.shuffle(order)
        got: dict[Kind, list[str]] = {}
        try:
            for kind in order:
                ids = k.allocator.preferred(kind, k.available(kind), [], request[kind])
                grant = k.allocator.allocate(kind, ids)
                got[kind] = list(grant.device_ids)
                k.held[kind].update(ids)
        except RequestError as exc:
            for kind, ids in got.items():  # the kubelet rejects the pod and frees what it got
                k.held[kind].difference_update(ids)
            del pods.by_uid[uid]
            k.allocator.pod_ended(uid)
            assert not had_room, f"{uid} {request} x{n} refused while the node had room: {exc}"
            continue
        # exactly what it asked, on one GPU (or its N GPUs), equal shares per GPU
        assert {kind: len(ids) for kind, ids in got.items()} == request
        gpus = {decode_id(i)[0] for ids in got.values() for i in ids}
        assert len(gpus) == (count or n), (uid, request, n, gpus)
        if mem and not core:  # reserves no compute: only where some is unreserved (docs/guide/modes.md)
            assert all(core_free[u] >= 5 for u in gpus), (uid, request, core_free)
        for ids in got.values():
            per_gpu: dict[str, int] = {}
            for i in ids:
                per_gpu[decode_id(i)[0]] = per_gpu.get(decode_id(i)[0], 0) + 1
            assert len(set(per_gpu.values())) == 1 and set(per_gpu) == gpus
        live[uid] = got
        # nothing given twice: live containers hold disjoint devices, and no GPU is both whole and shared
        seen: set[str] = set()
        for held in live.values():
            for ids in held.values():
                assert seen.isdisjoint(ids)
                seen.update(ids)
        whole = {decode_id(i)[0] for held in live.values() for i in held.get(Kind.COUNT, [])}
        shared = {decode_id(i)[0] for held in live.values() for kind in (Kind.MEM, Kind.CORE)
                  for i in held.get(kind, [])}
        assert not whole & shared
