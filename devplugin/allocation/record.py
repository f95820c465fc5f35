"""Step 4 of the allocation pipeline: what to record once a call's grant stands.

A preference is noted on the decision. An Allocate's devices go into the node view, the decision notes them, and
the cluster is told: the container's record and Event once it holds everything it asked for (a container placed
on a guess, or by node-local pairing, once PodResources names it: a sync is asked for), the node's room in use
after every change. A refusal is recorded too: the decision it belonged to must not catch the next container, and
its pod gets an Event.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devplugin.allocation.admissions import Admissions
from devplugin.allocation.decision import Decision
from devplugin.allocation.errors import RequestError
from devplugin.allocation.gpu_picks import RecentShares
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.kubelet_reads import kubelet_pods
from devplugin.allocation.node import Node
from devplugin.allocation.paired_decision import Paired
from devplugin.allocation.pairing_book import PairingBook
from devplugin.allocation.ports import ALLOCATOR_LOG, Grant, Links
from devplugin.allocation.units import Kind

log = logging.getLogger(ALLOCATOR_LOG)


@dataclass
class Record:
    node: Node
    holdings: Holdings
    book: PairingBook
    recent: RecentShares
    admissions: Admissions
    links: Links

    def preferred(self, dec: Decision, kind: Kind, ids: list[str]) -> None:
        dec.preferred[kind] = ids

    def paired_preferred(self, paired: Paired, kind: Kind, ids: list[str], must: Mapping[str, set[str]]) -> None:
        """A first half opens the decision its other half joins (gpu-count opens none)."""
        if kind is Kind.COUNT:
            return
        dec = paired.joined
        if dec is None:
            dec = self.book.open(paired.gpus)
            dec.kubelet_pods = paired.kubelet_pods if not must else kubelet_pods(self.links)
        dec.preferred[kind] = ids

    def allocated(self, grant: Grant, kind: Kind, groups: Mapping[str, set[str]]) -> None:
        dec = grant.decision
        assert dec is not None
        self.holdings.add(dec.dir_name, dec.key, kind, groups, exact=dec.exact)
        dec.allocated[kind] = list(grant.device_ids)
        if dec.complete:
            if dec.exact:
                self.links.reporter.placed(dec, self.node)
            else:  # recorded on its pod once PodResources names it (ViewSync.reconcile)
                self.links.on_guess()
        self.links.reporter.occupancy_changed(self.holdings)
        self._log_grant(dec, kind, grant.device_ids)

    def paired_allocated(self, paired: Paired, grant: Grant, kind: Kind, groups: Mapping[str, set[str]]) -> None:
        dec = grant.decision
        assert dec is not None
        if paired.joined is None:
            dec = self.book.adopt(dec)
            dec.kubelet_pods = kubelet_pods(self.links)
        self.holdings.add(dec.dir_name, None, kind, groups)
        held = self.holdings.get(dec.dir_name)
        if self.links.lookup is not None or (held is not None and held.key is not None):
            # placed without its pod's name (the lookup did not answer in time), or named from PodResources and the
            # pod cache between its resources (ViewSync.reconcile) and recorded only once it holds them all: a sync
            # in a moment names it and records it on its pod
            self.links.on_guess()
        self.book.allocated(dec, kind, list(grant.device_ids))
        if kind is not Kind.COUNT:
            self.recent.add(kind, len(grant.device_ids))
        self.links.reporter.occupancy_changed(self.holdings)
        self._log_grant(dec, kind, grant.device_ids)

    def refused(self, dec: Decision | None, exc: RequestError) -> None:
        """A refused call makes the kubelet reject the pod: its decision must not catch the next container."""
        self.book.close()
        if dec is not None and dec.key is not None:
            self.admissions.refuse(dec.key.pod_uid, dec.key.container)
            if self.admissions.latest is dec:
                self.admissions.latest = None
            self.links.reporter.refused(dec.pod, dec.key.container, str(exc))
        log.error("refused: %s", exc, extra={"fields": {"container": dec.label() if dec else "",
                                                        "code": exc.code.name}})

    def _log_grant(self, dec: Decision, kind: Kind, ids: Sequence[str]) -> None:
        # a known container's placement was logged once, whole, when it was decided: its grants are detail
        log.log(logging.DEBUG if dec.known else logging.INFO, "allocated %d %s on GPU %s to %s", len(ids),
                self.node.resource_name(kind), ",".join(str(self.node.by_uuid[u].index) for u in dec.gpus),
                dec.label(), extra={"fields": {"resource": self.node.resource_name(kind), "gpu": ",".join(dec.gpus),
                                               "devices": len(ids), "container": dec.label(),
                                               "state_dir": dec.dir_name}})
