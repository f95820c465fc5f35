"""The scheduler extender's three verbs as plain functions over ClusterState (and, for bind, the apiserver).

filter: which nodes can take the pod, and why the others cannot; prioritize: 0..10 per node by its placement;
preempt: which of kube-scheduler's eviction plans would free room on a GPU;
bind: choose the GPUs under the node's lock, assume them, create the Binding carrying the choice as annotations
(the apiserver writes them on the pod with spec.nodeName, in one update), and undo the assumption if it fails.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from devplugin.allocation.gpu_selection import Selection, SelectionError, read_selection
from devplugin.allocation.requests import PodRequest, PodRequestError, pod_request
from devplugin.contract import (
    ANN_ALIYUN_ASSIGNED,
    ANN_ALIYUN_ASSUME_TIME,
    ANN_ALIYUN_MEM_DEV,
    ANN_ALIYUN_MEM_IDX,
    ANN_ALIYUN_MEM_POD,
    ANN_SCHEDULED,
    PodAssignment,
)
from devplugin.scheduler import one_share
from devplugin.scheduler.fit import Ask, Fit, Item, NodeView, ask_of, fit, score, single_share
from devplugin.scheduler.one_share import ShareIndex, index_of
from devplugin.scheduler.selected import left_out, narrow
from devplugin.scheduler.state import ClusterState, NodeEntry, node_entry

log = logging.getLogger(__name__)

MIN_SCORE, MAX_SCORE = 0, 10


class BindError(RuntimeError):
    """A bind that did not happen; the message says why (it becomes the extender's Error)."""


class Cluster(Protocol):
    """The apiserver writes bind needs (kube side: devplugin.scheduler.cluster.KubeCluster)."""

    def get_pod(self, namespace: str, name: str) -> dict: ...

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Create the pod's Binding; the apiserver copies the Binding's annotations onto the pod in the same
        update that sets spec.nodeName, so the choice and the binding land together or not at all."""
        ...


@dataclass
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


def _views(state: ClusterState, pod: PodRequest, names: Sequence[str] | None,
           nodes: Sequence[Mapping] | None) -> list[tuple[str, NodeView | None]]:
    """The nodes of the request as views: by name from the state, or from the Node objects given (nodes the
    watch has not seen, e.g. cluster-autoscaler's templates, are read from the object itself)."""
    out: list[tuple[str, NodeView | None]] = list(state.views(names, pod.uid)) if names is not None else []
    for obj in nodes or ():
        name = str((obj.get("metadata") or {}).get("name", ""))
        view = state.view(name, pod.uid)
        out.append((name, view if view is not None else node_entry(obj, state.domain).view()))
    return out


def _indexes(state: ClusterState, pod: PodRequest, names: Sequence[str] | None,
             nodes: Sequence[Mapping] | None) -> tuple[Sequence[str], list[ShareIndex | None]]:
    """The nodes of the request (names, then the Node objects given) and their ShareIndex, as _views."""
    if not nodes:
        names = names if names is not None else []
        return names, state.indexes(names, pod.uid)
    views = _views(state, pod, names, nodes)
    return [n for n, _ in views], [index_of(v) if v is not None else None for _, v in views]


def _names(names: Sequence[str] | None, nodes: Sequence[Mapping] | None) -> list[str]:
    return list(names or ()) + [str((n.get("metadata") or {}).get("name", "")) for n in nodes or ()]


def filter_nodes(state: ClusterState, pod_obj: Mapping, names: Sequence[str] | None,
                 nodes: Sequence[Mapping] | None = None) -> FilterOutcome:
    out = FilterOutcome()
    try:
        pod = pod_request(pod_obj, state.domain)
    except PodRequestError as exc:
        out.unresolvable = dict.fromkeys(_names(names, nodes), str(exc))
        return out
    if not pod.gpu_containers:
        out.passed = _names(names, nodes)
        return out
    try:
        selection = read_selection(pod.annotations)
    except SelectionError as exc:
        out.unresolvable = dict.fromkeys(_names(names, nodes), str(exc))
        return out
    state.expire()
    ask = ask_of(pod)
    one = single_share(ask) if not ask.problem else None
    if one is not None and selection.empty and not nodes:  # the common case: the ask's kept answers
        out.passed, out.failed, out.unresolvable = state.share_filter(one.mem, one.core, names or [], pod.uid)
        state.filtered(pod.uid, out.passed)
        return out
    if one is not None:  # answered from each node's index
        listed, indexes = _indexes(state, pod, names, nodes)
        if not selection.empty:  # nodes it narrows are answered here, the others from their index
            listed, indexes = _narrowed_filter(ask, listed, indexes, selection, out)
        one_share.filter_nodes(listed, indexes, one.mem, one.core, out.passed, out.failed, out.unresolvable)
        state.filtered(pod.uid, out.passed)
        return out
    for name, view in _views(state, pod, names, nodes):
        if view is None:
            out.failed[name] = one_share.NOT_SEEN
            continue
        _note(out, name, fit_selected(ask, view, selection))
    state.filtered(pod.uid, out.passed)
    return out


def prioritize(state: ClusterState, pod_obj: Mapping, names: Sequence[str] | None,
               nodes: Sequence[Mapping] | None = None) -> list[tuple[str, int]]:
    """(node, score 0..10) for every node of the request; nodes the pod does not fit score 0."""
    listed, indexes, values = _scores(state, _scoring(state, pod_obj), names, nodes)
    return list(zip(listed, values, strict=True))


def prioritize_json(state: ClusterState, pod_obj: Mapping, names: Sequence[str] | None,
                    nodes: Sequence[Mapping] | None = None) -> str:
    """prioritize's answer as kube-scheduler reads it: [{"Host": node, "Score": score}, ...]."""
    scoring = _scoring(state, pod_obj)
    if scoring is not None and scoring.one is not None and scoring.selection.empty and not nodes:
        # the common case: the ask's kept answers
        return state.share_scores_json(scoring.one.mem, scoring.one.core, names or [], scoring.pod.uid)
    listed, indexes, values = _scores(state, scoring, names, nodes)
    if indexes is None:
        return json.dumps([{"Host": h, "Score": s} for h, s in zip(listed, values, strict=True)])
    return one_share.scores_json(listed, indexes, values)


@dataclass(frozen=True)
class _Scoring:
    """A pod as prioritize scores it."""

    pod: PodRequest
    selection: Selection
    ask: Ask
    one: Item | None  # its one share on one GPU, when that is all it asks


def _scoring(state: ClusterState, pod_obj: Mapping) -> _Scoring | None:
    """The pod read for prioritize; None when every node scores MIN_SCORE (an unreadable pod, one asking for no
    GPU, a GPU selection that cannot be read)."""
    try:
        pod = pod_request(pod_obj, state.domain)
        if not pod.gpu_containers:
            return None
        selection = read_selection(pod.annotations)
    except (PodRequestError, SelectionError):
        return None
    ask = ask_of(pod)
    return _Scoring(pod, selection, ask, single_share(ask) if not ask.problem else None)


def _scores(state: ClusterState, scoring: _Scoring | None, names: Sequence[str] | None,
            nodes: Sequence[Mapping] | None) -> tuple[Sequence[str], list[ShareIndex | None] | None, list[int]]:
    """(the nodes, their indexes when the scores came from them, else None, the scores)."""
    if scoring is None:
        listed = _names(names, nodes)
        return listed, None, [MIN_SCORE] * len(listed)
    pod, selection, ask, one = scoring.pod, scoring.selection, scoring.ask, scoring.one
    if one is not None:  # answered from each node's index
        nodes_listed, indexes = _indexes(state, pod, names, nodes)
        values = one_share.scores(indexes, one.mem, one.core)
        if not selection.empty:  # nodes it narrows are scored on the GPUs it allows
            for i, ix in enumerate(indexes):
                if ix is not None and not ix.problem and left_out(ix.view.catalog, selection):
                    values[i] = _score(ask, ix.view, selection)
        return nodes_listed, indexes, values
    views = _views(state, pod, names, nodes)
    return ([name for name, _ in views], None,
            [_score(ask, view, selection) if view is not None else MIN_SCORE for _, view in views])


def _note(out: FilterOutcome, name: str, result: Fit) -> None:
    """Files node `name` under filter's answer by its fit."""
    if result.ok:
        out.passed.append(name)
    elif result.unresolvable:
        out.unresolvable[name] = result.reason
    else:
        out.failed[name] = result.reason


def _narrowed_filter(ask: Ask, listed: Sequence[str], indexes: Sequence[ShareIndex | None], selection: Selection,
                     out: FilterOutcome) -> tuple[list[str], list[ShareIndex | None]]:
    """filter for a one-share pod with a GPU selection: the nodes it narrows are answered into `out` by fit on the
    GPUs it allows; the nodes it leaves whole (and nodes not seen) are returned, to be answered from their index."""
    whole_names: list[str] = []
    whole: list[ShareIndex | None] = []
    for name, ix in zip(listed, indexes, strict=True):
        if ix is None or ix.problem or not left_out(ix.view.catalog, selection):
            whole_names.append(name)
            whole.append(ix)
            continue
        _note(out, name, fit_selected(ask, ix.view, selection))
    return whole_names, whole


def fit_selected(ask: Ask, view: NodeView, selection: Selection) -> Fit:
    """fit(ask, view) on the GPUs the pod's selection allows: a node with none of them fails unresolvable, and a
    refusal on the others says which were left out and why."""
    if selection.empty or ask.problem:
        return fit(ask, view)
    narrowed = narrow(view, selection)
    if isinstance(narrowed, str):
        return Fit(reason=narrowed, unresolvable=True)
    placed = fit(ask, narrowed.view)
    return replace(placed, reason=placed.reason + narrowed.note) if not placed.ok else placed


def _score(ask: Ask, view: NodeView, selection: Selection) -> int:
    if selection.empty:
        return score(view, fit(ask, view))
    narrowed = narrow(view, selection)
    return MIN_SCORE if isinstance(narrowed, str) else score(narrowed.view, fit(ask, narrowed.view))


def preempt(state: ClusterState, pod_obj: Mapping, victims: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
    """kube-scheduler's preemption candidates (node -> UIDs of the pods it would evict), kept only where evicting
    them leaves room for the pod on the node's GPUs: evictions that free the node's total but no GPU the pod
    fits on are dropped."""
    return {node: list(victims[node]) for node in preempt_nodes(state, pod_obj, victims)}


def preempt_nodes(state: ClusterState, pod_obj: Mapping, victims: Mapping[str, Collection[str]]) -> list[str]:
    """The nodes of `victims` that preempt keeps, in their order."""
    try:
        pod = pod_request(pod_obj, state.domain)
    except PodRequestError:
        return []
    if not pod.gpu_containers:
        return list(victims)
    try:
        selection = read_selection(pod.annotations)
    except SelectionError:
        return []
    ask = ask_of(pod)
    one = single_share(ask) if not ask.problem and selection.empty else None
    if one is not None:  # the common case: the node's index, and the GPUs the victims hold recounted
        mem, core = one.mem, one.core

        def keep(ix: ShareIndex, entry: NodeEntry) -> bool:
            if one_share.fits_index(ix, mem, core):  # evicting only frees room
                return True
            if not one_share.could_fit_freed(ix, mem, core):
                return False
            freed = entry.freed_rooms({pod.uid, *victims[entry.name]})
            return one_share.fits_rooms(freed, ix.core_mode, mem, core)

        return state.evictions(victims, keep)
    kept = []
    for node, uids in victims.items():
        view = state.view(node, {pod.uid, *uids})
        if view is not None and fit_selected(ask, view, selection).ok:
            kept.append(node)
    return kept


def bind(state: ClusterState, cluster: Cluster, namespace: str, name: str, uid: str, node: str) -> PodAssignment:
    """Place the pod on `node`'s GPUs, write the choice on it, bind it. BindError says why not."""
    pod_obj = state.pod(namespace, name)
    if pod_obj is None or (uid and (pod_obj.get("metadata") or {}).get("uid") != uid):
        try:
            pod_obj = cluster.get_pod(namespace, name)
        except Exception as exc:
            raise BindError(f"reading pod {namespace}/{name} failed: {exc}") from None
    got_uid = str((pod_obj.get("metadata") or {}).get("uid", ""))
    if uid and got_uid != uid:
        raise BindError(f"pod {namespace}/{name} has uid {got_uid}, not {uid}: it was deleted and re-created")
    try:
        pod = pod_request(pod_obj, state.domain)
    except PodRequestError as exc:
        raise BindError(f"pod {namespace}/{name}: {exc}") from None
    if pod.node_name:  # an earlier bind whose answer was lost: what it holds stays as the watch shows it
        raise BindError(f"pod {pod.key} is already bound to node {pod.node_name}")
    if not pod.gpu_containers:
        # It names a managed resource with a zero quantity only (`aliyun.com/gpu-mem: 0`): kube-scheduler, for
        # which the pod is this extender's (IsInterested reads names, not amounts), leaves the bind to it. There
        # is nothing to place: the pod is bound as kube-scheduler chose, without a GPU choice.
        _write(cluster, pod, node, None)
        log.info("bound to %s (it asks for no GPU)", node, extra={"fields": {"pod": pod.key, "node": node}})
        return PodAssignment(node=node, time_ns=time.time_ns(), containers={})
    try:
        selection = read_selection(pod.annotations)
    except SelectionError as exc:
        raise BindError(f"pod {pod.key}: {exc}") from None
    if not state.passed_filter(pod.uid, node):
        raise BindError(f"pod {pod.key} did not pass this extender's filter for node {node} (or that was more than "
                        f"{state.assume_ttl_s:.0f} s ago); kube-scheduler filters again and retries")
    state.expire()
    with state.node_lock(node):
        view = state.view(node, pod.uid)
        if view is None:
            raise BindError(f"node {node} is not known to the extender")
        placed = fit_selected(ask_of(pod), view, selection)
        if not placed.ok:
            raise BindError(f"pod {pod.key} no longer fits node {node}: {placed.reason}")
        state.assume(pod, node, placed.containers)
    assignment = PodAssignment(node=node, time_ns=time.time_ns(), containers=placed.containers)
    try:
        _write(cluster, pod, node, bind_annotations(pod, view, placed, assignment))
    except BindError:
        state.forget(pod.uid)
        raise
    state.confirm_bound(pod.uid)
    log.info("bound to %s", node, extra={"fields": {"pod": pod.key, "node": node, "gpus": _gpus_text(placed)}})
    return assignment


def _write(cluster: Cluster, pod: PodRequest, node: str, annotations: dict[str, str] | None) -> None:
    try:
        cluster.bind_pod(pod.namespace, pod.name, pod.uid, node, annotations or {})
    except Exception as exc:
        raise BindError(f"binding pod {pod.key} to {node} failed: {exc}") from None


def bind_annotations(pod: PodRequest, view: NodeView, placed: Fit, assignment: PodAssignment) -> dict[str, str]:
    """ANN_SCHEDULED plus Alibaba's five annotations (GPU of the first GPU container, the pod's total gpu-mem)."""
    order = sorted(pod.gpu_containers, key=lambda c: (c.init, c.position))
    first = next(c for c in order if c.name in placed.containers)
    share = placed.containers[first.name][0]
    dev = next((g.mem_total for g in view.gpus if g.index == share.index), 0)
    return {
        ANN_SCHEDULED: assignment.render(),
        ANN_ALIYUN_MEM_IDX: str(share.index),
        ANN_ALIYUN_MEM_POD: str(sum(c.mem for c in pod.containers if not c.init or c.sidecar)),
        ANN_ALIYUN_MEM_DEV: str(dev),
        ANN_ALIYUN_ASSIGNED: "false",
        ANN_ALIYUN_ASSUME_TIME: str(assignment.time_ns),
    }


def _gpus_text(placed: Fit) -> str:
    return "; ".join(f"{name}: " + ",".join(f"{s.index}" + ("(whole)" if s.whole else f"({s.mem}m/{s.core}c)")
                                             for s in shares)
                     for name, shares in placed.containers.items())
