"""The extender's view of the cluster: nodes (inventory, usage, labels), the GPUs each pod holds, and the
extender's own assumptions (bound by it but not yet seen bound in the watch).

Who is believed (docs/reference/security.md): the node daemon is the authority for its node. A node's room is the
daemon's published usage (gpushare.io/gpu-usage) plus the containers in flight: of pods bound (by this extender, or
seen bound with a GPU choice), the containers not yet in that usage, i.e. not named by a daemon's record
(gpushare.io/allocated) of a time the usage has reached. The daemon records a pod container by container, as the
kubelet admits them, so a record that names the first container only leaves the others in flight. A container in
flight is counted from its own request at the GPUs its choice names (placements.bounded): a pod's annotations steer
that pod and nothing else. A node without a usage annotation (an older daemon) counts every bound GPU pod that way.

Fed by the informers (or directly by tests); rebuilt from the apiserver alone on restart, since every fact
here is an annotation or a label. Thread-safe: one lock guards the maps (short sections); `node_lock(name)`
serialises bind decisions per node so different nodes proceed in parallel.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from devplugin.allocation.requests import PodRequest, PodRequestError, pod_request
from devplugin.contract import (
    ANN_ALLOCATED,
    ANN_NODE_GPUS,
    ANN_NODE_USAGE,
    DEFAULT_RESOURCE_DOMAIN,
    LABEL_PLACEMENT,
    MODES,
    PLACEMENTS,
    AnnotationError,
    NodeInventory,
    NodeUsage,
    parse_assignment,
    parse_inventory,
    parse_usage,
)
from devplugin.kube.labels import mode_from_labels
from devplugin.scheduler.ask_answers import MAX_ASKS, AskAnswers
from devplugin.scheduler.fit import NodeView
from devplugin.scheduler.gpu_catalog import GpuCatalog
from devplugin.scheduler.one_share import ShareIndex, index_of
from devplugin.scheduler.placements import Holding, counted, pod_holding
from devplugin.scheduler.room import GpuRoom, node_room

log = logging.getLogger(__name__)

DEFAULT_ASSUME_TTL_S = 60.0
MIN_CHANGES_KEPT = 4096  # node changes kept for the asks' answers at least (twice the nodes in a larger cluster)

Recorded = tuple[int, frozenset[str]]  # the time of the node daemon's record of a pod, and the containers it names
NO_RECORD: Recorded = (0, frozenset())


@dataclass
class Held:
    """The GPUs one pod holds on one node; `assumed` until the watch shows the pod bound."""

    uid: str
    key: str
    node: str
    shares: Holding
    source: str
    assumed: bool = False
    expires: float = 0.0  # clock time after which an unbound assumption is dropped
    bound: bool = False  # our Binding was created; the watch has not shown the pod bound yet
    recorded: Recorded = NO_RECORD  # the node daemon's record of the pod: its time and the containers it names


@dataclass(slots=True)
class NodeEntry:
    name: str
    mode: str = ""
    placement: str = "binpack"
    unit_mib: int = 1024
    inventory: NodeInventory | None = None
    usage: NodeUsage | None = None
    problem: str = ""
    held: dict[str, Held] = field(default_factory=dict)
    cached: NodeView | None = None  # the view with every pod counted; None when stale
    cached_index: ShareIndex | None = None  # the index of `cached`
    catalog: GpuCatalog = field(default_factory=GpuCatalog)  # the inventory's GPUs for pods' GPU selections

    def stale(self) -> None:
        """A pod on the node changed: its view and index are built again when next asked for."""
        self.cached = self.cached_index = None

    def index(self) -> ShareIndex:
        """The ShareIndex of the view with every pod counted (stale() drops both)."""
        ix = self.cached_index
        if ix is None:
            ix = self.cached_index = index_of(self.view())
        return ix

    def freed_rooms(self, out: Collection[str]) -> list[GpuRoom]:
        """The rooms of the GPUs that the pods `out` hold on this node, as view(out) counts them: the full view's
        room less those pods' shares the daemon's usage does not count, and the usage less their shares it counts
        (never below zero); the other GPUs are as in the full view. [] when none of them is held here."""
        gone = [h for u in out if (h := self.held.get(u)) is not None]
        if not gone or self.inventory is None:
            return []
        usage = self.usage
        mine: dict[int, GpuRoom] = {}  # shares counted on top of the usage
        theirs: dict[int, GpuRoom] = {}  # shares in the usage
        for h in gone:
            counted = _in_usage(h.recorded, usage)
            for name, shares in h.shares.items():
                into = theirs if name in counted else mine
                for share in shares:
                    room = into.get(share.index)
                    if room is None:
                        room = into[share.index] = GpuRoom(share.index, "", 0)
                    room.hold(share)
        base = {r.index: r for r in self.view().gpus}
        none = GpuRoom(-1, "", 0)
        rooms = []
        for index in sorted(mine.keys() | theirs.keys()):
            full = base.get(index)
            if full is None:
                continue
            room = full.copy()
            m, t = mine.get(index, none), theirs.get(index, none)
            room.mem_used -= m.mem_used
            room.core_used -= m.core_used
            room.containers -= m.containers
            used = usage.gpus.get(index) if usage is not None else None
            if used is not None:
                room.mem_used += max(used.mem - t.mem_used, 0) - max(used.mem, 0)
                room.core_used += max(used.core - t.core_used, 0) - max(used.core, 0)
                room.containers += max(used.containers - t.containers, 0) - max(used.containers, 0)
            if full.whole:
                room.whole = (any(s.whole and s.index == index for u, h in self.held.items() if u not in out
                                  for shares in not_in_usage(h.shares, h.recorded, usage).values()
                                  for s in shares)
                              or (used is not None and used.whole and not t.whole))
            rooms.append(room)
        return rooms

    def view(self, without: str | Collection[str] = "") -> NodeView:
        """The node as fit sees it; `without` leaves pods out by UID (a pod scheduled again, preemption victims)."""
        out = {without} if isinstance(without, str) else set(without)
        if out & self.held.keys() and self.inventory is not None:
            rooms = node_room(self.inventory,
                              (not_in_usage(h.shares, h.recorded, self.usage) for u, h in self.held.items()
                               if u not in out),
                              self.usage,
                              (in_usage(h.shares, h.recorded, self.usage) for u, h in self.held.items() if u in out))
            return NodeView(self.name, self.mode, self.placement, self.unit_mib, rooms, self.problem, self.catalog)
        if self.cached is None:
            rooms = () if self.inventory is None else node_room(
                self.inventory, (not_in_usage(h.shares, h.recorded, self.usage) for h in self.held.values()),
                self.usage)
            self.cached = NodeView(self.name, self.mode, self.placement, self.unit_mib, rooms, self.problem,
                                   self.catalog)
        return self.cached


def daemon_record(pod: PodRequest) -> Recorded:
    """The node daemon's record of the pod (gpushare.io/allocated) for the node it is bound to: its time and the
    containers it names; NO_RECORD when there is none. A forged record only makes the pod's own room uncounted
    until the daemon admits it."""
    raw = pod.annotations.get(ANN_ALLOCATED)
    if not raw:
        return NO_RECORD
    try:
        record = parse_assignment(raw, ANN_ALLOCATED)
    except AnnotationError:
        return NO_RECORD
    mine = record.node in ("", pod.node_name) and record.uid in ("", pod.uid)
    return (max(int(record.time_ns), 0), frozenset(record.containers)) if mine else NO_RECORD


def _in_usage(recorded: Recorded, usage: NodeUsage | None) -> frozenset[str]:
    """The containers of a pod a node's published usage already counts: those the daemon's record names, when the
    record is no newer than the usage (the daemon publishes its usage again after every record it writes)."""
    time_ns, names = recorded
    return names if usage is not None and 0 < time_ns <= usage.time_ns else frozenset()


def not_in_usage(holding: Holding, recorded: Recorded, usage: NodeUsage | None) -> Holding:
    """The rule, for the extender and inspect alike: the part of a pod's holding (container -> shares) that the
    node's published usage does not count yet, to be counted on top of it. The daemon records a pod container by
    container, as the kubelet admits them, and may publish its usage in between: a usage newer than a record that
    names the first container only counts that one, the others are still in flight."""
    counted = _in_usage(recorded, usage)
    return {name: shares for name, shares in holding.items() if name not in counted} if counted else holding


def in_usage(holding: Holding, recorded: Recorded, usage: NodeUsage | None) -> Holding:
    """The part of a pod's holding that the node's published usage counts (the rest of `not_in_usage`)."""
    counted = _in_usage(recorded, usage)
    return {name: shares for name, shares in holding.items() if name in counted}


def node_entry(obj: Mapping, domain: str = DEFAULT_RESOURCE_DOMAIN) -> NodeEntry:
    """A node (apiserver JSON) as the extender sees it; `problem` says why it cannot take GPU pods."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    entry = NodeEntry(name)
    raw = ann.get(ANN_NODE_GPUS)
    if raw is None:
        entry.problem = (f"node publishes no GPU inventory (annotation {ANN_NODE_GPUS}); run the devplugin node "
                         "daemon on it, or keep GPU pods off it")
        return entry
    try:
        inv = parse_inventory(raw)
    except AnnotationError as exc:
        entry.problem = f"{exc}; the node daemon must republish it"
        return entry
    if inv.domain != domain:
        entry.problem = (f"node serves {inv.domain}/gpu-mem (its daemon's --resource-domain), this extender schedules "
                         f"{domain}/gpu-mem; run both with the same --resource-domain")
        return entry
    label_mode = mode_from_labels(dict(labels))
    # The daemon serves what it published; a label that turns compute shares off wins at once.
    entry.mode = inv.mode if inv.mode != "core_mem" or not label_mode else label_mode
    placement = labels.get(LABEL_PLACEMENT, inv.placement)
    entry.placement = placement if placement in PLACEMENTS else "binpack"
    entry.unit_mib = inv.mem_unit_mib
    entry.inventory = inv
    entry.catalog = GpuCatalog.of(inv)
    if entry.mode not in MODES:
        entry.problem = f"node mode {entry.mode!r} is not one of {', '.join(MODES)}"
    raw_usage = ann.get(ANN_NODE_USAGE)
    if raw_usage is not None:
        try:
            entry.usage = parse_usage(raw_usage)
        except AnnotationError as exc:
            log.warning("%s; counting pods' annotations only", exc, extra={"fields": {"node": name}})
    return entry


class ClusterState:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 assume_ttl_s: float = DEFAULT_ASSUME_TTL_S, domain: str = DEFAULT_RESOURCE_DOMAIN) -> None:
        self.clock = clock
        self.domain = domain
        self.assume_ttl_s = assume_ttl_s
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeEntry] = {}
        self._held: dict[str, Held] = {}  # uid -> where
        self._assumed: dict[str, Held] = {}  # uid -> assumptions that can still expire
        self._pods: dict[str, dict] = {}  # "ns/name" -> pod JSON, GPU pods only
        self._node_locks: dict[str, threading.Lock] = {}
        self._largest = 0
        self._filtered: dict[str, tuple[float, Collection[str]]] = {}  # pod uid -> (when, nodes its filter passed)
        self._changes: list[str] = []  # nodes whose entry or pods changed, in order (ask_answers.py)
        self._changes_base = 0  # the count of changes before the first of _changes
        self._asks: dict[tuple[int, int], AskAnswers] = {}  # the last asks answered, least recent first
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()

    # ------------------------------------------------------------------ nodes
    def upsert_node(self, obj: Mapping) -> None:
        entry = node_entry(obj, self.domain)
        if not entry.name:
            return
        with self._lock:
            old = self._nodes.get(entry.name)
            if old is not None:
                entry.held = old.held
            self._nodes[entry.name] = entry
            self._largest = 0
            self._changed(entry.name)

    def delete_node(self, name: str) -> None:
        with self._lock:
            entry = self._nodes.pop(name, None)
            if entry is not None:
                for uid in entry.held:
                    self._held.pop(uid, None)
                self._changed(name)
            self._largest = 0

    def replace_nodes(self, items: Iterable[Mapping]) -> None:
        """A full list (start, or after the watch expired): nodes not in it are gone."""
        seen = set()
        for obj in items:
            self.upsert_node(obj)
            seen.add(str((obj.get("metadata") or {}).get("name", "")))
        with self._lock:
            for name in [n for n in self._nodes if n not in seen]:
                self.delete_node(name)
        self.nodes_synced.set()

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    def view(self, name: str, without: str | Collection[str] = "") -> NodeView | None:
        with self._lock:
            entry = self._nodes.get(name)
            return entry.view(without) if entry is not None else None

    def views(self, names: Iterable[str], without: str = "") -> list[tuple[str, NodeView | None]]:
        """Views of many nodes under one lock (filter and prioritize ask for every node)."""
        with self._lock:
            nodes = self._nodes
            held = self._held.get(without)
            special = held.node if held is not None else None  # the one node where the pod itself is counted
            return [(n, (e.cached or e.view()) if n != special else e.view(without))
                    if (e := nodes.get(n)) is not None else (n, None) for n in names]

    def indexes(self, names: Iterable[str], without: str = "") -> list[ShareIndex | None]:
        """The ShareIndex of each node named (None for a node not known), under one lock: filter and prioritize
        ask for every node. On the node where the pod `without` is held, the index leaves it out."""
        with self._lock:
            get = self._nodes.get
            held = self._held.get(without)
            if held is None:
                return [(e.cached_index or e.index()) if (e := get(n)) is not None else None for n in names]
            special = held.node
            return [((e.cached_index or e.index()) if n != special else index_of(e.view(without)))
                    if (e := get(n)) is not None else None for n in names]

    def evictions(self, victims: Mapping[str, Collection[str]], keep: Callable[[ShareIndex, NodeEntry], bool]
                  ) -> list[str]:
        """The nodes of `victims` (node -> pods evicted there) for which keep(index, entry) holds, under one lock."""
        with self._lock:
            get = self._nodes.get
            return [node for node in victims if (e := get(node)) is not None and keep(e.index(), e)]

    def share_filter(self, mem: int, core: int, names: Sequence[str], uid: str
                     ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """filter's (passed, failed, unresolvable) over `names` for pod `uid` asking one share of `mem` and `core`,
        from the ask's kept answers (ask_answers.py); on the node where the pod is held, its index leaves it out."""
        with self._lock:
            return self._answers(mem, core).filter(names, self._nodes, self._own(uid))

    def share_scores_json(self, mem: int, core: int, names: Sequence[str], uid: str) -> str:
        """prioritize's answer over `names` for the same pod, as share_filter."""
        with self._lock:
            return self._answers(mem, core).scores_json(names, self._own(uid))

    def largest_gpu_units(self) -> int:
        """The largest healthy GPU in the cluster, in gpu-mem units (0 when no node publishes an inventory)."""
        with self._lock:
            if not self._largest:
                self._largest = max((g.mem_units for e in self._nodes.values() if e.inventory
                                     for g in e.inventory.gpus), default=0)
            return self._largest

    def has_mode(self, mode: str) -> bool:
        """Some node of the cluster runs in this mode (ack.node.gpu.schedule)."""
        with self._lock:
            return any(e.mode == mode for e in self._nodes.values())

    def node_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._node_locks.setdefault(name, threading.Lock())

    # ------------------------------------------------------------------ pods
    def upsert_pod(self, obj: Mapping) -> None:
        try:
            pod = pod_request(obj, self.domain)
        except PodRequestError as exc:
            log.debug("pod skipped: %s", exc)
            return
        gpu = bool(pod.gpu_containers) and not pod.finished
        held = pod_holding(pod) if gpu and pod.node_name else None
        recorded = daemon_record(pod) if held is not None else NO_RECORD
        with self._lock:
            if gpu:
                self._pods[pod.key] = dict(obj)
            else:
                self._pods.pop(pod.key, None)
            old = self._held.get(pod.uid)
            if not gpu:
                self._drop(pod.uid)  # ended, or asks for no GPU: holds nothing whatever its annotations say
            elif old is not None and old.assumed and pod.node_name == old.node:
                # our own choice, now seen bound: keep it (the daemon's record, once its usage shows it, ends it)
                self._assumed.pop(pod.uid, None)
                old.assumed, old.bound = False, True
                old.recorded = recorded
                if held is not None and held[0] == ANN_ALLOCATED:
                    old.shares, old.source = held[1], held[0]
                self._touch(old)
            elif held is not None:
                self._keep(Held(pod.uid, pod.key, pod.node_name, held[1], held[0], recorded=recorded))
            elif old is not None and pod.node_name and not old.assumed:
                self._drop(pod.uid)  # its annotations are gone

    def delete_pod(self, obj: Mapping) -> None:
        meta = obj.get("metadata") or {}
        with self._lock:
            self._pods.pop(f"{meta.get('namespace', 'default')}/{meta.get('name', '')}", None)
            self._drop(str(meta.get("uid", "")))

    def replace_pods(self, items: Iterable[Mapping]) -> None:
        """A full list: pods not in it are gone (assumptions stay until the watch shows them or they expire)."""
        items = list(items)
        uids = {str((o.get("metadata") or {}).get("uid", "")) for o in items}
        with self._lock:
            for uid in [u for u, h in self._held.items() if u not in uids and not h.assumed]:
                self._drop(uid)
            self._pods.clear()
        for obj in items:
            self.upsert_pod(obj)
        self.pods_synced.set()

    def pod(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            return self._pods.get(f"{namespace}/{name}")

    def held(self, uid: str) -> Held | None:
        with self._lock:
            return self._held.get(uid)

    def pods_on(self, node: str) -> list[Held]:
        with self._lock:
            entry = self._nodes.get(node)
            return list(entry.held.values()) if entry else []

    # ------------------------------------------------------------------ filter answers bind relies on
    def filtered(self, uid: str, passed: Collection[str]) -> None:
        """Remember which nodes a pod's latest filter passed: bind binds only there (within the assume TTL), once.
        The collection is kept as given (filter's own list, not copied: thousands of names a pod)."""
        now = self.clock()
        with self._lock:
            if len(self._filtered) > 4096:  # pods filtered and never bound (another profile, deleted): forget
                for u in [u for u, (t, _) in self._filtered.items() if now - t > self.assume_ttl_s]:
                    del self._filtered[u]
            self._filtered[uid] = (now, passed)

    def passed_filter(self, uid: str, node: str) -> bool:
        with self._lock:
            when, nodes = self._filtered.get(uid, (float("-inf"), ()))
        return node in nodes and self.clock() - when <= self.assume_ttl_s

    # ------------------------------------------------------------------ assumptions
    def assume(self, pod: PodRequest, node: str, shares: Holding) -> Held:
        held = Held(pod.uid, pod.key, node, counted(pod, shares), "assumed", assumed=True,
                    expires=self.clock() + self.assume_ttl_s)
        with self._lock:
            self._keep(held)
        return held

    def confirm_bound(self, uid: str) -> None:
        """Our Binding succeeded; the watch replaces the assumption when it shows the pod bound (within ms). If
        it never does (the pod was deleted and the event missed), the assumption still expires. The pod's filter
        answer is spent: a bind is not repeated."""
        with self._lock:
            self._filtered.pop(uid, None)
            held = self._held.get(uid)
            if held is not None and held.assumed:
                held.bound = True

    def assumptions(self) -> int:
        """GPU choices made by bind that the watch has not shown bound yet (they expire after the TTL)."""
        with self._lock:
            return len(self._assumed)

    def forget(self, uid: str) -> None:
        with self._lock:
            held = self._held.get(uid)
            if held is not None and held.assumed:
                self._drop(uid)

    def expire(self) -> list[Held]:
        """Drop assumptions whose pod was not bound in time; returns them."""
        now = self.clock()
        with self._lock:
            gone = [h for h in self._assumed.values() if h.expires <= now]
            for h in gone:
                self._drop(h.uid)
        for h in gone:
            why = "not seen bound by the watch" if h.bound else "not bound"
            log.warning("assumption expired: pod %s in %.0f s; its room on %s is free again", why,
                        self.assume_ttl_s, h.node, extra={"fields": {"pod": h.key, "node": h.node}})
        return gone

    # ------------------------------------------------------------------ internals (lock held)
    def _changed(self, node: str) -> None:
        """The node's entry or a pod on it changed: the kept answers of every ask take it again when next used.
        The list is emptied once it outgrows twice the nodes; an ask whose last call is older is built afresh."""
        self._changes.append(node)
        if len(self._changes) > max(MIN_CHANGES_KEPT, 2 * len(self._nodes)):
            self._changes_base += len(self._changes)
            self._changes = []

    def _stale(self, entry: NodeEntry) -> None:
        """A pod on the node changed: its view and index are built again, and the asks' answers take it again."""
        entry.stale()
        self._changed(entry.name)

    def _answers(self, mem: int, core: int) -> AskAnswers:
        """The ask's kept answers, brought up to date with the changes since its last call."""
        key = (mem, core)
        answers = self._asks.pop(key, None)
        end = self._changes_base + len(self._changes)
        if answers is None or answers.seen < self._changes_base:
            answers = AskAnswers(mem, core)
            for name, entry in self._nodes.items():
                answers.update(name, entry.cached_index or entry.index())
        elif answers.seen < end:
            nodes = self._nodes
            for name in set(self._changes[answers.seen - self._changes_base:]):
                changed = nodes.get(name)
                answers.update(name, (changed.cached_index or changed.index()) if changed is not None else None)
        answers.seen = end
        self._asks[key] = answers
        if len(self._asks) > MAX_ASKS:
            del self._asks[next(iter(self._asks))]
        return answers

    def _own(self, uid: str) -> tuple[str, ShareIndex] | None:
        """The node where pod `uid` is held and its index without the pod, or None."""
        held = self._held.get(uid)
        entry = self._nodes.get(held.node) if held is not None else None
        return (entry.name, index_of(entry.view(uid))) if entry is not None else None

    def _keep(self, held: Held) -> None:
        self._drop(held.uid)
        self._held[held.uid] = held
        if held.assumed:
            self._assumed[held.uid] = held
        entry = self._nodes.get(held.node)
        if entry is None:
            entry = self._nodes[held.node] = NodeEntry(held.node, problem="node not seen yet")
        entry.held[held.uid] = held
        self._stale(entry)

    def _touch(self, held: Held) -> None:
        entry = self._nodes.get(held.node)
        if entry is not None:
            self._stale(entry)

    def _drop(self, uid: str) -> None:
        self._assumed.pop(uid, None)
        held = self._held.pop(uid, None)
        if held is None:
            return
        entry = self._nodes.get(held.node)
        if entry is not None:
            entry.held.pop(uid, None)
            self._stale(entry)
