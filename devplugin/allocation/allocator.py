"""GetPreferredAllocation and Allocate as one short pipeline over the node, its view and the pods bound to it.

The gRPC servicers are thin wrappers over `Allocator.preferred` and `Allocator.allocate`; tests call these
directly. Each call goes through four steps, each in its own file, none returning to an earlier one:

1. which container this call is for (which_container.py): the container being admitted now, one the pod cache
   names, or none that can be named in time;
2. the container's decision: placed whole, every resource it asks for on the same GPU(s), on its first call
   (container_decision.py), or by node-local pairing for a container nobody could name (paired_decision.py);
3. the grant for this call, from that decision: the preferred units, or the checked IDs, envs and shim files of an
   Allocate (call_grant.py);
4. what to record: the node view, the decision, what the cluster is told; or the refusal (record.py).

Beside them, the state they share: the node view (holdings.py) kept in step with the kubelet (view_sync.py), what
the allocator remembers of the containers it admits (admissions.py), what a restarted kubelet forgot
(readmission.py), node-local pairing's open decision (pairing_book.py) and recent sizes (gpu_picks.RecentShares). The
steps call out through the allocator's links (ports.Links), which the daemon wires after building it.

All state changes happen under one lock (the kubelet serialises admissions anyway). Nothing is committed before
everything that can fail has succeeded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from devplugin.allocation.admissions import Admissions
from devplugin.allocation.call_grant import CallGrant
from devplugin.allocation.container_decision import ContainerDecision
from devplugin.allocation.decision import Decision
from devplugin.allocation.errors import RequestError
from devplugin.allocation.gpu_picks import RecentShares
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.idsets import group_ids
from devplugin.allocation.node import Node
from devplugin.allocation.paired_decision import PARTNER_MINIMUM, PairedDecision
from devplugin.allocation.pairing_book import PairingBook
from devplugin.allocation.ports import (
    Grant,
    HeldDevices,
    KubeletListing,
    MountProvider,
    PodLookup,
    Reporter,
)
from devplugin.allocation.readmission import Readmission
from devplugin.allocation.record import Record
from devplugin.allocation.requests import PodRequest
from devplugin.allocation.units import Kind
from devplugin.allocation.view_sync import ViewSync
from devplugin.allocation.which_container import Found, WhichContainer

T = TypeVar("T")


@dataclass
class Allocator:
    node: Node
    pair_window_s: float = 1.0
    mounts: MountProvider | None = None
    lookup: PodLookup | None = None
    reporter: Reporter = field(default_factory=Reporter)
    lookup_budget_s: float = 0.3
    # Once more, this long, for an apiserver that did not answer within the budget (a slow one; one that refuses
    # answers at once): node-local pairing cannot follow the scheduler's GPU choice, and on a loaded node it placed
    # a container's first resource where its second had no room.
    lookup_patience_s: float = 5.0
    healthy: Callable[[str], bool] = field(default=lambda uuid: True)
    # Re-reads the kubelet's PodResources into the node view (Allocator.reconcile); called before a refusal for lack
    # of room, since only a call of the same resource shows its devices free again (a gpu-count pod that ended
    # frees its GPU for gpu-mem too, but no gpu-count call may come to say so).
    resync: Callable[[], object] | None = None
    refresh: Callable[[], object] | None = None  # resync() unless the view was read from the kubelet a moment ago
    # Told how each pod lookup ended (LOOKUP_OUTCOMES), for metrics; called under the lock, must not block.
    on_lookup: Callable[[str], object] = field(default=lambda outcome: None)
    # Called (under the lock, must not block) when a container was placed as the likeliest of several asking alike
    # and no later call of it came to confirm it, or when a container placed by node-local pairing and named between
    # its resources got its last one: PodResources should be read soon to name or record it (NodeSync.poke_soon).
    on_guess: Callable[[], object] = field(default=lambda: None)
    # Reads the kubelet's PodResources now and syncs the view with it (None when it cannot be asked).
    read_kubelet: Callable[[], KubeletListing | None] | None = None
    # Reads only which pods the kubelet lists now, no sync (None when it cannot be asked): without a pod cache, the
    # second call of a container placed by node-local pairing needs no more (kubelet_reads.listed_pods).
    read_pods: Callable[[], frozenset[tuple[str, str]] | None] | None = None

    def __post_init__(self) -> None:
        # the state the steps share, then the steps, each given that state and this allocator as its links
        # (ports.Links: the fields above, some of which the daemon sets after building it)
        self.recent = RecentShares(PARTNER_MINIMUM)
        self.holdings = Holdings(self.node)
        self.book = PairingBook(self.pair_window_s)
        self.admissions = Admissions()
        self.readmission = Readmission()
        self.view = ViewSync(self.node, self.holdings, self.recent, self.book, self.admissions, self.readmission,
                             self)
        self.which_container = WhichContainer(self.node, self.holdings, self.book, self.admissions,
                                              self.readmission, self)
        self.container_decision = ContainerDecision(self.node, self.holdings, self.admissions, self)
        self.paired_decision = PairedDecision(self.node, self.holdings, self.book, self.recent, self)
        self.call_grant = CallGrant(self.node, self.holdings, self.recent, self)
        self.record = Record(self.node, self.holdings, self.book, self.recent, self.admissions, self)
        self._lock = threading.RLock()  # resync() re-enters through reconcile()

    # ================================================================== GetPreferredAllocation
    def preferred(self, kind: Kind, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The device IDs this container should get: `size` of `available`, including `must_include`."""
        res = self.node.resource_name(kind)
        if size <= 0:
            raise RequestError(f"{res}: allocation size must be positive, got {size}")
        avail = group_ids(self.node, kind, available, "available IDs")
        must = group_ids(self.node, kind, must_include, "must-include IDs")
        for uuid, ids in must.items():
            missing = ids - avail.get(uuid, set())
            if missing:
                raise RequestError(f"{res}: must-include IDs are not among the available IDs ({len(missing)} missing)")
        with self._lock:
            self.view.observe_available(kind, avail, must_include)
            dec = None
            try:
                # the container first, so that a refusal of its request reaches its pod as an Event
                dec = self._decision(kind, size, must_include, avail)
                if dec is not None:
                    out = self.call_grant.preferred(dec, kind, avail, must, size)
                    self.record.preferred(dec, kind, out)
                    return out
                paired = self.paired_decision.for_preferred(kind, avail, must, size)
                out = self.call_grant.paired_preferred(paired, kind, avail, must, size)
                self.record.paired_preferred(paired, kind, out, must)
                return out
            except RequestError as exc:
                self.record.refused(dec, exc)
                raise

    # ================================================================== Allocate
    def allocate(self, kind: Kind, ids: Sequence[str]) -> Grant:
        """Validate one container's IDs of `kind` and say what the container gets."""
        res = self.node.resource_name(kind)
        if not ids:
            raise RequestError(f"{res}: Allocate carried no device IDs")
        groups = group_ids(self.node, kind, ids, "Allocate IDs")
        with self._lock:
            dec = None
            try:
                dec = self._decision(kind, len(ids), ids, None)
                if dec is not None:
                    grant = self.call_grant.allocate(dec, kind, ids, groups)
                    self.record.allocated(grant, kind, groups)
                    return grant
                paired = self.paired_decision.for_allocate(kind, ids, groups)
                grant = self.call_grant.paired_allocate(paired, kind, ids, groups)
                self.record.paired_allocated(paired, grant, kind, groups)
                return grant
            except RequestError as exc:
                self.record.refused(dec, exc)
                raise

    def _decision(self, kind: Kind, amount: int, ids: Sequence[str],
                  avail: Mapping[str, set[str]] | None) -> Decision | None:
        """Steps 1 and 2 for a container that can be named: its decision (placed whole on its first call); None
        for node-local pairing."""
        found = self.which_container.for_call(kind, amount, ids, avail)
        if isinstance(found, Found):
            return self.container_decision.place(found, kind, avail)
        return found

    # ================================================================== the node view
    def reconcile(self, held: Sequence[HeldDevices], pods: Sequence[PodRequest] | None,
                  as_of: float | None = None, listed: Collection[tuple[str, str]] | None = None) -> None:
        """The kubelet's PodResources joined with the pod cache (ViewSync.reconcile)."""
        with self._lock:
            self.view.reconcile(held, pods, as_of, listed)

    def kubelet_restarted(self) -> None:
        """The kubelet restarted: for a while, containers PodResources does not list are not taken as ended. Not
        under the lock: the registration worker calls it; it sets deadlines and clears the readmission memory."""
        self.view.kubelet_restarted()

    def pod_ended(self, pod_uid: str) -> None:
        """The pod cache saw a pod finish or go: its units come back."""
        with self._lock:
            self.view.pod_ended(pod_uid)

    def snapshot(self, read: Callable[[Holdings], T]) -> T:
        """read(holdings) with no admission in flight (for publishers off the admission path)."""
        with self._lock:
            return read(self.holdings)

    def guesses(self) -> int:
        """Containers placed as the likeliest of several asking alike that PodResources has not named yet: not
        recorded on their pods until it does (ViewSync.reconcile)."""
        with self._lock:
            return sum(1 for h in self.holdings.holders() if h.key is not None and not h.exact)


__all__ = ["Allocator"]
