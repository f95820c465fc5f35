"""The extender's answers as they were computed before the per-node ShareIndex (devplugin/scheduler/one_share.py):
node by node from its view, the one-share paths with their own refusal texts, preemption from a view recounted
without the victims. Kept as the oracle the property tests compare the indexed answers with."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from devplugin.allocation.requests import PodRequestError, pod_request
from devplugin.allocation.unreserved import core_needed
from devplugin.scheduler.fit import MODES_WITH_CORE, NodeView, _core_short, ask_of, fit, score, single_share
from devplugin.scheduler.room import mem_text
from devplugin.scheduler.state import ClusterState, node_entry


def _why_not_one(node: NodeView, mem: int, core: int) -> str:
    where, tail, best = node.share_texts
    if not node.open_rooms:
        return f"{where}: no GPU can take a share{tail}"
    if best < mem:
        return (f"{where}: at most {mem_text(best, node.unit_mib)} free on one GPU, {mem_text(mem, node.unit_mib)} "
                f"asked{tail}")
    best_core = max(t[1] for t in node.open_rooms if t[0] >= mem)
    return _core_short(where, mem, core, best_core, node.unit_mib, tail)


def _one_share_check(mem: int, core: int, needs_core: bool, node: NodeView) -> tuple[str, bool]:
    if node.problem:
        return node.problem, True
    if needs_core and node.mode not in MODES_WITH_CORE:
        return f"node mode {node.mode} does not serve gpu-core.percentage (only core_mem nodes do)", True
    need = core_needed(node.mode, mem, core)
    for t in node.open_rooms:
        if t[0] >= mem and t[1] >= need:
            return "", False
    return _why_not_one(node, mem, core), False


def _one_share_score(mem: int, core: int, needs_core: bool, node: NodeView) -> int:
    total, used = node.mem_totals
    if not total or node.problem or (needs_core and node.mode not in MODES_WITH_CORE):
        return 0
    need = core_needed(node.mode, mem, core)
    for t in node.open_rooms:
        if t[0] >= mem and t[1] >= need:
            break
    else:
        return 0
    frac = min((used + mem) / total, 1.0)
    return int(10 * (frac if node.placement != "spread" else 1.0 - frac) + 0.5)


def _views(state: ClusterState, uid: str, names: Sequence[str] | None,
           nodes: Sequence[Mapping] | None) -> list[tuple[str, NodeView | None]]:
    out = [(n, state.view(n, uid)) for n in names or ()]
    for obj in nodes or ():
        name = str((obj.get("metadata") or {}).get("name", ""))
        view = state.view(name, uid)
        out.append((name, view if view is not None else node_entry(obj, state.domain).view()))
    return out


def _names(names: Sequence[str] | None, nodes: Sequence[Mapping] | None) -> list[str]:
    return list(names or ()) + [str((n.get("metadata") or {}).get("name", "")) for n in nodes or ()]


def filter_before(state: ClusterState, pod_obj: Mapping, names: Sequence[str] | None,
                  nodes: Sequence[Mapping] | None = None) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(passed, failed, unresolvable)."""
    try:
        pod = pod_request(pod_obj, state.domain)
    except PodRequestError as exc:
        return [], {}, dict.fromkeys(_names(names, nodes), str(exc))
    if not pod.gpu_containers:
        return _names(names, nodes), {}, {}
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    ask = ask_of(pod)
    one = single_share(ask) if not ask.problem else None
    for name, view in _views(state, pod.uid, names, nodes):
        if view is None:
            failed[name] = "node not seen by the extender yet (its watch is catching up); retry"
            continue
        if one is not None:
            reason, unres = _one_share_check(one.mem, one.core, ask.needs_core, view)
        else:
            result = fit(ask, view)
            reason, unres = result.reason, result.unresolvable
        if not reason:
            passed.append(name)
        elif unres:
            unresolvable[name] = reason
        else:
            failed[name] = reason
    return passed, failed, unresolvable


def prioritize_before(state: ClusterState, pod_obj: Mapping, names: Sequence[str] | None,
                      nodes: Sequence[Mapping] | None = None) -> list[tuple[str, int]]:
    try:
        pod = pod_request(pod_obj, state.domain)
    except PodRequestError:
        return [(n, 0) for n in _names(names, nodes)]
    views = _views(state, pod.uid, names, nodes)
    if not pod.gpu_containers:
        return [(name, 0) for name, _ in views]
    ask = ask_of(pod)
    one = single_share(ask) if not ask.problem else None
    if one is not None:
        return [(name, _one_share_score(one.mem, one.core, ask.needs_core, view) if view is not None else 0)
                for name, view in views]
    return [(name, score(view, fit(ask, view)) if view is not None else 0) for name, view in views]


def preempt_before(state: ClusterState, pod_obj: Mapping,
                   victims: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
    try:
        pod = pod_request(pod_obj, state.domain)
    except PodRequestError:
        return {}
    if not pod.gpu_containers:
        return {node: list(uids) for node, uids in victims.items()}
    ask = ask_of(pod)
    kept = {}
    for node, uids in victims.items():
        view = state.view(node, {pod.uid, *uids})
        if view is not None and fit(ask, view).ok:
            kept[node] = list(uids)
    return kept
