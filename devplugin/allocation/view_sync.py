"""Keeping the node view in step with the kubelet: the `available` IDs of every call and the pod cache free the
devices of containers that ended; PodResources (joined with the pod cache) forgets containers the kubelet no longer
lists, learns those it lists (after a restart), names containers placed without pod lookup and writes decisions not
yet recorded on their pods. One object the allocator holds (allocator.py), called under its lock; it owns the
restart grace and, through the readmission memory (readmission.py), what a restarted kubelet forgot."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from devplugin.allocation.admissions import Admissions
from devplugin.allocation.container_candidates import recorded_containers
from devplugin.allocation.decision import ContainerKey, state_dir_name
from devplugin.allocation.errors import NoRoom
from devplugin.allocation.gpu_picks import RecentShares
from devplugin.allocation.holdings import Holding, Holdings
from devplugin.allocation.idsets import group_ids, id_index
from devplugin.allocation.node import Node
from devplugin.allocation.pairing_book import PairingBook
from devplugin.allocation.ports import ALLOCATOR_LOG, HeldDevices, Links
from devplugin.allocation.readmission import Readmission
from devplugin.allocation.requests import PodRequest
from devplugin.allocation.units import Kind

T = TypeVar("T")
log = logging.getLogger(__name__)
released_log = logging.getLogger(ALLOCATOR_LOG)  # the lines of devices released by a call or a pod's end
# After a kubelet restart its PodResources lists no pod (or some) until its pod sources have delivered them again,
# while its device manager still holds their devices (its checkpoint): absence from PodResources means nothing
# for this long.
KUBELET_RESTART_GRACE_S = 10.0


def with_resync(resync: Callable[[], object] | None, attempt: Callable[[], T]) -> T:
    """attempt(); on NoRoom, once more after re-reading PodResources (the view may be stale for resources the
    kubelet has not called since they were freed)."""
    try:
        return attempt()
    except NoRoom:
        if resync is None:
            raise
        resync()
        return attempt()


@dataclass
class ViewSync:
    node: Node
    holdings: Holdings
    recent: RecentShares
    book: PairingBook
    admissions: Admissions
    readmission: Readmission
    links: Links
    absence_ignored_until: float = 0.0
    seeded: bool = False  # the first reconcile (at start) has seeded the recent request sizes

    def observe_available(self, kind: Kind, avail: Mapping[str, set[str]], must_include: Sequence[str]) -> None:
        """A call's `available` IDs: devices the kubelet offers again were released by whoever held them."""
        freed = self.holdings.observe_available(kind, avail, must_include)
        if freed:
            # the restarted kubelet offers a known container's devices again: it forgot that allocation and may
            # admit the container again (readmission.py)
            self.readmission.offered_again(freed)
            released_log.info("%d container(s) released their devices (the kubelet offers them again)", len(freed),
                              extra={"fields": {"resource": self.node.resource_name(kind),
                                                "containers": ",".join(str(h.key or h.holder) for h in freed)}})
            latest = self.admissions.latest
            if latest is not None and any(h.holder == latest.dir_name for h in freed):
                self.admissions.latest = None
            self.links.reporter.occupancy_changed(self.holdings)
        self.book.forget_rolled_back(kind, avail)

    def pod_ended(self, pod_uid: str) -> None:
        """The pod cache saw a pod finish or go: its units come back."""
        gone = self.holdings.drop_pod(pod_uid)
        self.admissions.pod_ended(pod_uid)
        if gone:
            released_log.info("pod ended: %d container(s) released their devices", len(gone),
                              extra={"fields": {"pod_uid": pod_uid,
                                                "containers": ",".join(str(h.key) for h in gone)}})
            self.links.reporter.occupancy_changed(self.holdings)

    def kubelet_restarted(self) -> None:
        """The kubelet restarted: for a while, containers PodResources does not list are not taken as ended."""
        now = time.monotonic()
        self.absence_ignored_until = now + KUBELET_RESTART_GRACE_S
        self.readmission.kubelet_restarted(now)
        log.info("the kubelet restarted: for %.0f s, containers its PodResources does not list are kept",
                 KUBELET_RESTART_GRACE_S)

    def reconcile(self, held: Sequence[HeldDevices], pods: Sequence[PodRequest] | None,
                  as_of: float | None = None, listed: Collection[tuple[str, str]] | None = None) -> None:
        """The kubelet's PodResources (every container holding our devices, by namespace, pod and container name)
        joined with the pod cache: forget containers the kubelet no longer lists, learn those it lists that we do
        not know (after a restart), name containers placed without pod lookup, and write every decision that is
        not recorded on its pod yet. `as_of`: when PodResources was asked (containers placed since are kept);
        `listed`: the pods (namespace, name) that list names (a container of one of them is kept until its
        devices are listed)."""
        by_name = {(p.namespace, p.name): p for p in pods or () if not p.finished}
        every: dict[Kind, set[str]] = {k: set() for k in Kind}
        for entry in held:
            for kind, ids in entry.devices.items():
                every[kind].update(ids)
        changed = False
        if time.monotonic() >= self.absence_ignored_until:
            gone = self.holdings.keep_only(every, as_of, listed)
            if gone:
                log.info("%d container(s) no longer listed by the kubelet: their devices are free", len(gone),
                         extra={"fields": {"containers": ",".join(str(h.key or h.holder) for h in gone)}})
            changed = bool(gone)
        for entry in held:
            changed |= self._reconcile_one(entry, by_name.get((entry.namespace, entry.pod)))
        self.seeded = True
        if changed:
            self.links.reporter.occupancy_changed(self.holdings)

    def _learn(self, holder: str, key: ContainerKey | None, devices: Mapping[Kind, Sequence[str]]) -> bool:
        """Record devices the kubelet says a container holds; IDs this node does not advertise are logged, skipped."""
        learned = False
        for kind, ids in devices.items():
            known = id_index(self.node, kind).every
            strangers = [i for i in ids if i not in known]
            if strangers:
                log.warning("ignoring %d held %s devices this node does not advertise, e.g. %r",
                            len(strangers), self.node.resource_name(kind), strangers[0])
            good = [i for i in dict.fromkeys(ids) if i in known]
            if good:
                self.holdings.add(holder, key, kind, group_ids(self.node, kind, good, "held IDs"))
                learned = True
                if kind is not Kind.COUNT and not self.seeded:  # at start: what containers here ask guides
                    self.recent.add(kind, len(good))          # node-local pairing from the first admission
        return learned

    def _reconcile_one(self, entry: HeldDevices, pod: PodRequest | None) -> bool:
        key = ContainerKey(pod.uid, entry.container, entry.namespace, entry.pod) if pod else None
        ids = [i for kind_ids in entry.devices.values() for i in kind_ids]
        owners = self.holdings.owners(ids)
        changed = False
        if not owners:
            holder = state_dir_name(key) if key else f"held:{entry.namespace}/{entry.pod}/{entry.container}"
            changed = self._learn(holder, key, entry.devices)
            owners = {holder}
            if key:
                log.info("container %s holds devices (learned from the kubelet)", key,
                         extra={"fields": {"pod": f"{key.namespace}/{key.pod}", "container": key.container}})
        if pod is None or key is None:
            return changed
        mine: list[Holding] = []
        for holder in owners:
            h = self.holdings.get(holder)
            if h is None:
                continue
            if h.key is None:
                h.key = key
                self.links.reporter.warning(pod, "PlacedWithoutPodLookup",
                                      f"container {entry.container} was placed by node-local pairing because the "
                                      "apiserver could not be asked in time; its devices are recorded now")
            elif h.key != key and not h.exact and h.key.pod_uid != key.pod_uid:
                # placed as the likeliest of several containers asking alike: the kubelet says whose it is
                log.info("container %s holds the devices placed for %s (which asks alike); named from the "
                         "kubelet's PodResources", key, h.key,
                         extra={"fields": {"pod": f"{key.namespace}/{key.pod}", "container": key.container}})
                h.key = key
                changed = True
            if h.key != key:
                continue
            h.exact = True
            mine.append(h)
        latest = self.admissions.latest
        in_flight = latest is not None and not latest.complete and any(h.holder == latest.dir_name for h in mine)
        if mine and not in_flight and entry.container not in recorded_containers(pod):
            held = merged(mine)
            if self._holds_all(held, pod, entry.container):
                self.links.reporter.record_holding(pod, held, self.node)
        return changed

    def _holds_all(self, held: Holding, pod: PodRequest, container: str) -> bool:
        """The container holds every resource it asks for. The kubelet lists a container's first resource before it
        asks for the next (and this sync may run in between, e.g. on a container placed by node-local pairing and
        named by the pod cache only now): a record written then would say the first resource alone, and no later
        sync writes it again once the pod carries a record. Recorded once whole (record.py asks for a sync then)."""
        spec = pod.container(container)
        if spec is None:
            return True
        asked = {k for k, n in ((Kind.MEM, spec.mem), (Kind.CORE, spec.core), (Kind.COUNT, spec.count))
                 if n and k in self.node.kinds}
        return asked <= set(held.ids)


def merged(holdings: Sequence[Holding]) -> Holding:
    """One container's holdings as one (a container that two holders hold parts of, e.g. placed by node-local
    pairing and named later)."""
    if len(holdings) == 1:
        return holdings[0]
    out = Holding(holdings[0].holder, holdings[0].key)
    for h in holdings:
        for kind, per_gpu in h.ids.items():
            mine = out.ids.setdefault(kind, {})
            for uuid, ids in per_gpu.items():
                mine[uuid] = mine.get(uuid, frozenset()) | ids
    return out
