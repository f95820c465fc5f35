"""The common pod, one share on one GPU, answered for every node of a request from a small index per node.

kube-scheduler sends filter and prioritize every node that passed its own checks (5,000 names in a cluster of
5,000 nodes), once per pod. Most GPU pods have one container asking for one share, and for those what a node
answers depends on a few numbers of its view, gathered into a ShareIndex once per view (a view is rebuilt only
when the node or a pod on it changes): the memory free on each GPU that can take a share, ascending, and for each
the most compute free among the GPUs with at least that much memory. A node then answers with one binary search,
and a refusal is written once per distinct text and shared by the nodes that give it.

The answers are fit's and score's, word for word (tests/scheduler/test_one_share.py compares them on random
clusters). The loops allocate no object per node that outlives the iteration but the answer's own strings, so a
request over thousands of nodes leaves the cyclic garbage collector nothing to do.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from devplugin.allocation.unreserved import MODE as CORE_MODE
from devplugin.allocation.unreserved import core_needed
from devplugin.contract import CORE_PER_GPU
from devplugin.scheduler.fit import NodeView, mode_refusal, one_share_refusal
from devplugin.scheduler.room import GpuRoom

NOT_SEEN = "node not seen by the extender yet (its watch is catching up); retry"
# prioritize's answer is written as json.dumps([{"Host": name, "Score": score}, ...]) writes it
_SCORE_TAILS = tuple(f"{s}}}" for s in range(11))


@dataclass(frozen=True, slots=True)
class ShareIndex:
    """What one share on one GPU needs of a node view (see the module docstring)."""

    view: NodeView
    problem: str  # the node takes no GPU pod (no inventory, unknown mode, ...)
    core_mode: bool  # the node serves gpu-core.percentage (and a memory-only share needs unreserved compute)
    mode_refusal: str  # why it takes no pod asking for gpu-core.percentage ('' when core_mode)
    mems: tuple[int, ...]  # memory free of each GPU that can take a share (healthy, not held whole), ascending
    cores: tuple[int, ...]  # cores[i]: the most compute free among those GPUs with at least mems[i] free
    total: int  # memory of the healthy GPUs (gpu-mem units)
    used: int  # memory held on them
    spread: bool  # placement spread (else binpack)
    largest: int  # the most memory of one healthy GPU: no eviction frees more on one GPU
    host: str  # '{"Host": <the node's name as JSON>, "Score": ', the start of its entry in prioritize's answer


def index_of(view: NodeView) -> ShareIndex:
    rooms = sorted(view.open_rooms)
    cores: list[int] = []
    most = -1
    for room in reversed(rooms):
        most = max(most, room[1])
        cores.append(most)
    total, used = view.mem_totals
    largest = max((r.mem_total for r in view.gpus if r.healthy), default=0)
    return ShareIndex(view, view.problem, view.mode == CORE_MODE, mode_refusal(view.mode),
                      tuple(r[0] for r in rooms), tuple(reversed(cores)), total, used, view.placement == "spread",
                      largest, host_prefix(view.name))


def host_prefix(name: str) -> str:
    return '{"Host": ' + json.dumps(name) + ', "Score": '


def _refusal(ix: ShareIndex, i: int, mem: int, core: int, memo: dict[tuple, str]) -> str:
    """fit's words for a node where the share does not fit; `i` is where `mem` falls in ix.mems."""
    where, tail, _ = ix.view.share_texts
    best = ix.mems[-1] if ix.mems else None
    best_core = ix.cores[i] if i < len(ix.mems) else None
    key = (where, tail, ix.view.unit_mib, best, best_core)
    text = memo.get(key)
    if text is None:
        text = memo[key] = one_share_refusal(where, tail, ix.view.unit_mib, mem, core, best, best_core)
    return text


PASS, FAIL, UNRESOLVABLE = 0, 1, 2  # what a node answers filter for a share


def node_answer(ix: ShareIndex, mem: int, core: int, need_core_mode: int, memo: dict[tuple, str]
                ) -> tuple[int, str]:
    """(PASS, FAIL or UNRESOLVABLE, why) for one node; `need_core_mode` is core_needed(CORE_MODE, mem, core)."""
    if ix.problem:
        return UNRESOLVABLE, ix.problem
    if ix.core_mode:
        need = need_core_mode
    elif core:
        return UNRESOLVABLE, ix.mode_refusal
    else:
        need = 0
    mems = ix.mems
    i = bisect_left(mems, mem)
    if i < len(mems) and ix.cores[i] >= need:
        return PASS, ""
    return FAIL, _refusal(ix, i, mem, core, memo)


def node_score(ix: ShareIndex, mem: int, core: int, need_core_mode: int) -> int:
    """prioritize's 0..10 for one node, 0 where the share does not fit (score's arithmetic)."""
    if not ix.total or ix.problem:
        return 0
    if ix.core_mode:
        need = need_core_mode
    elif core:
        return 0
    else:
        need = 0
    mems = ix.mems
    i = bisect_left(mems, mem)
    if i < len(mems) and ix.cores[i] >= need:
        frac = (ix.used + mem) / ix.total
        if frac > 1.0:
            frac = 1.0
        return int(10 * (1.0 - frac if ix.spread else frac) + 0.5)
    return 0


def filter_nodes(names: Sequence[str], indexes: Sequence[ShareIndex | None], mem: int, core: int,
                 passed: list[str], failed: dict[str, str], unresolvable: dict[str, str]) -> None:
    """filter for a pod whose one GPU container asks for `mem` and `core` on one GPU: each name goes to passed,
    failed (with why) or unresolvable (with why)."""
    need_core_mode = core_needed(CORE_MODE, mem, core)  # a memory-only share needs unreserved compute there
    memo: dict[tuple, str] = {}
    for name, ix in zip(names, indexes, strict=True):
        if ix is None:
            failed[name] = NOT_SEEN
            continue
        kind, why = node_answer(ix, mem, core, need_core_mode, memo)
        if kind == PASS:
            passed.append(name)
        elif kind == FAIL:
            failed[name] = why
        else:
            unresolvable[name] = why


def scores(indexes: Sequence[ShareIndex | None], mem: int, core: int) -> list[int]:
    """prioritize for the same pod: 0..10 per node, 0 where it does not fit (score's arithmetic)."""
    need_core_mode = core_needed(CORE_MODE, mem, core)
    return [node_score(ix, mem, core, need_core_mode) if ix is not None else 0 for ix in indexes]


def score_entry(ix: ShareIndex, value: int) -> str:
    """One node's entry of prioritize's answer."""
    return ix.host + _SCORE_TAILS[value]


def unseen_entry(name: str) -> str:
    """The entry of a node the extender does not know (score 0)."""
    return host_prefix(name) + _SCORE_TAILS[0]


def scores_json(names: Sequence[str], indexes: Sequence[ShareIndex | None], values: Sequence[int]) -> str:
    """[{"Host": name, "Score": value}, ...] as json.dumps writes it, from the nodes' prepared prefixes."""
    return "[" + ", ".join([(ix.host if ix is not None else host_prefix(name)) + _SCORE_TAILS[v]
                            for name, ix, v in zip(names, indexes, values, strict=True)]) + "]"


def _need(core_mode: bool, mem: int, core: int) -> int:
    """The compute a GPU must have free for the share (fit's core_needed): on a core_mem node a memory-only share
    needs some unreserved; elsewhere the share asks none (a pod that asks some is refused there first)."""
    return core_needed(CORE_MODE, mem, core) if core_mode else core


def fits_index(ix: ShareIndex, mem: int, core: int) -> bool:
    """The share fits the node as its index shows it."""
    if ix.problem or (core and not ix.core_mode):
        return False
    i = bisect_left(ix.mems, mem)
    return i < len(ix.mems) and ix.cores[i] >= _need(ix.core_mode, mem, core)


def could_fit_freed(ix: ShareIndex, mem: int, core: int) -> bool:
    """Whether evicting pods could make room for the share: the node serves it and one of its GPUs is big enough.
    Eviction only frees room, so a node where this is False stays refused whatever the victims."""
    if ix.problem or (core and not ix.core_mode):
        return False
    return mem <= ix.largest and _need(ix.core_mode, mem, core) <= CORE_PER_GPU


def fits_rooms(rooms: Sequence[GpuRoom], core_mode: bool, mem: int, core: int) -> bool:
    """The share fits one of `rooms` (fit's rule for one share on one GPU)."""
    need = _need(core_mode, mem, core)
    return any(r.healthy and not r.whole and r.mem_free >= mem and r.core_free >= need for r in rooms)
