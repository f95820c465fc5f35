"""Step 1 of the allocation pipeline: which container this call is for.

The kubelet's calls carry no pod identity. A call is for the container being admitted now when its decision still
expects this resource (confirmed, or re-keyed to the container that really holds its first resource, from the
kubelet's PodResources); otherwise for a container the pod cache names (container_candidates.py), the app container
an init container's devices are handed on to included; or for a container nobody can name in time, placed by
node-local pairing (paired_decision.py). Nothing here places anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from devplugin.allocation.admissions import Admissions
from devplugin.allocation.container_candidates import candidates, next_app_container
from devplugin.allocation.container_need import asked
from devplugin.allocation.decision import ContainerKey, Decision, key_of
from devplugin.allocation.errors import PairingConflict, RequestError
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.idsets import gpu_label
from devplugin.allocation.node import Node
from devplugin.allocation.pairing_book import PairingBook
from devplugin.allocation.ports import ALLOCATOR_LOG, Links
from devplugin.allocation.readmission import Readmission
from devplugin.allocation.requests import ContainerRequest, PodRequest
from devplugin.allocation.selected_gpus import excluded_gpus
from devplugin.allocation.units import Kind

log = logging.getLogger(ALLOCATOR_LOG)


@dataclass(frozen=True)
class Found:
    """A container named for this call, not placed yet."""

    pod: PodRequest
    container: ContainerRequest
    exact: bool = True  # False: the likeliest of several pending containers asking alike
    fixed: tuple[str, ...] | None = None  # the GPUs of the init container whose devices it is handed
    reused_from: ContainerKey | None = None  # that init container


@dataclass
class WhichContainer:
    node: Node
    holdings: Holdings
    book: PairingBook
    admissions: Admissions
    readmission: Readmission
    links: Links

    def for_call(self, kind: Kind, amount: int, ids: Sequence[str],
                 avail: Mapping[str, set[str]] | None) -> Decision | Found | None:
        """The decision of the container being admitted, if this call is its; else the container the pod cache
        names; None when node-local pairing places it. `avail` is None for Allocate."""
        latest = self.admissions.latest
        if (latest is not None and latest.known and latest.allocated and kind not in latest.allocated
                and not latest.complete and (not latest.exact or not latest.pending(kind, amount))):
            # the next resource of the container being admitted: the kubelet lists its first one by now
            latest = self._identify(latest)
        if latest is not None and latest.pending(kind, amount):
            latest.touched = time.monotonic()
            return latest
        if self.links.lookup is None:
            return None
        if self.book.joinable(kind, for_allocate=avail is None):
            return None  # the second call of a container placed without its pod: do not wait for the lookup again
        taken = self.admissions.taken(self.holdings)
        return self._reuse(kind, amount, ids, taken) or self._find(kind, amount, taken)

    def _find(self, kind: Kind, amount: int, taken: set[tuple[str, str]]) -> Found | None:
        """The container this first call is for; exact when no other pending container asks alike (after reading
        the kubelet's PodResources: containers it lists are not pending)."""
        lookup = self.links.lookup
        assert lookup is not None
        found = self._candidates(lookup.pods(), kind, amount, taken)
        if found:
            self.links.on_lookup("cache")
        else:
            fresh = lookup.fetch_now(self.links.lookup_budget_s)
            if fresh is None and self.links.lookup_patience_s > 0:
                fresh = lookup.fetch_now(self.links.lookup_patience_s)
            found = self._candidates(fresh, kind, amount, taken)
            self.links.on_lookup("direct" if found else "no_answer" if fresh is None else "not_found")
            if not found:
                # named, and its pod told, once PodResources and the pod cache can name it (ViewSync.reconcile)
                why = ("the apiserver did not answer within the lookup budget" if fresh is None
                       else f"no pending container on this node asks for {amount} {self.node.resource_name(kind)}")
                log.warning("placing without pod identity: %s; using node-local pairing", why,
                            extra={"fields": {"resource": self.node.resource_name(kind), "amount": amount}})
                return None
        pod, container = found[0]
        return Found(pod, container, exact=len(found) == 1)

    def _candidates(self, pods: list[PodRequest] | None, kind: Kind, amount: int,
                    taken: set[tuple[str, str]]) -> list[tuple[PodRequest, ContainerRequest]]:
        if pods is None:
            return []
        again = self.readmission.forgotten()
        found = candidates(pods, kind.value, amount, taken, again)
        if len(found) > 1 and self.links.resync is not None and self.links.resync():
            # several ask alike: the containers the kubelet lists holding devices are not pending, and those
            # placed on a guess are named now
            found = candidates(pods, kind.value, amount, self.admissions.taken(self.holdings), again)
        return found

    def _reuse(self, kind: Kind, amount: int, ids: Sequence[str], taken: set[tuple[str, str]]) -> Found | None:
        """The kubelet hands an init container's devices to the pod's app container (it does not ask us which):
        the call names devices an init container holds."""
        for holder in sorted(self.holdings.owners(ids)):
            h = self.holdings.get(holder)
            if h is None or h.key is None:
                continue
            pods = self.links.lookup.pods() if self.links.lookup else None
            pod = next((p for p in pods or () if p.uid == h.key.pod_uid), None)
            owner = pod.container(h.key.container) if pod else None
            if pod is None or owner is None or not owner.init or owner.sidecar:
                continue  # a sidecar keeps its devices for the pod's life: the kubelet hands on only an init's
            app = next_app_container(pod, kind.value, amount, taken, owner.position)
            if app is not None:
                return Found(pod, app, fixed=tuple(sorted(h.gpus(), key=lambda u: self.node.by_uuid[u].index)),
                             reused_from=h.key)
        return None

    def _identify(self, dec: Decision) -> Decision | None:
        """The container being admitted, as the kubelet's PodResources names it (it lists the devices of the
        container's first resource before asking for the next): `dec` confirmed, re-keyed to the container that
        really holds its devices, or `dec` unchanged when the kubelet cannot be asked or does not list them."""
        if self.links.resync is None or not self.links.resync():
            return self.admissions.latest
        h = self.holdings.get(dec.dir_name)
        if h is None or h.key is None or not h.exact or self.admissions.latest is not dec:
            return self.admissions.latest
        if h.key == dec.key:
            dec.exact = True
            return dec
        pods = self.links.lookup.pods() if self.links.lookup else None
        pod = next((p for p in pods or () if p.uid == h.key.pod_uid), None)
        container = pod.container(h.key.container) if pod else None
        if pod is None or container is None:
            return dec
        guessed = dec.label()
        reporter = self.links.reporter
        try:
            its = asked(self.node, pod, container)
            excluded = excluded_gpus(pod, self.node)
        except RequestError as exc:
            self.admissions.latest = None
            reporter.refused(pod, container.name, str(exc))
            raise
        gpus_txt = ", ".join(gpu_label(self.node, u) for u in dec.gpus)
        banned = [u for u in dec.gpus if u in excluded]
        if its.gpus != len(dec.gpus) or banned:
            self.admissions.latest = None
            why = (f"its pod's GPU selection excludes {gpu_label(self.node, banned[0])} ({excluded[banned[0]]})"
                   if banned else f"it needs {its.gpus} GPU(s)")
            conflict = PairingConflict(
                f"container {key_of(pod, container)}: its first resource was placed on {gpus_txt} for {guessed}, "
                f"which asks alike, but {why}; refusing rather than splitting it (the pod can be created again)",
                reason="identity")
            reporter.refused(pod, container.name, str(conflict))
            raise conflict
        fixed = replace(dec, key=h.key, pod=pod, container=container, request=its.request, per_gpu=its.per_gpu,
                        exact=True, source=f"where its first resource went, placed for {guessed} (which asks alike)")
        log.warning("container %s: its first resource was placed for %s, which asks alike; the kubelet's "
                    "PodResources names it: its other resources follow on GPU %s", h.key, guessed,
                    ",".join(str(self.node.by_uuid[u].index) for u in dec.gpus),
                    extra={"fields": {"pod": pod.key, "container": container.name, "gpu": ",".join(dec.gpus)}})
        reporter.warning(pod, "GPUPlacedForAnotherContainer",
                         f"container {container.name}: its first resource was placed on "
                         f"{', '.join(gpu_label(self.node, u) for u in dec.gpus)} for {guessed} (several "
                         "pending containers ask alike); the rest of it goes to the same GPU")
        self.admissions.latest = fixed
        return fixed
