"""Step 2 of the allocation pipeline: the container's decision, placed whole.

A container the pod cache named (which_container.py) is placed at once, every resource it asks for on the same
GPU(s): where an init container's devices are handed on to it; else where a scheduler chose (scheduler_choice.py)
or, without a choice, where a plan for the pod's app containers put it, when that GPU has room; else by the node's
policy (container_placement.py). Every later call of the container is answered from this decision. A container
nobody could name is decided by node-local pairing instead (paired_decision.py).
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass

from devplugin.allocation.admissions import Admissions
from devplugin.allocation.container_candidates import recorded_containers
from devplugin.allocation.container_need import asked, need_of
from devplugin.allocation.container_placement import Need, Room, place, plan_together
from devplugin.allocation.decision import Decision, key_of
from devplugin.allocation.errors import NoRoom, RequestError
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.node import Node
from devplugin.allocation.ports import ALLOCATOR_LOG, Links
from devplugin.allocation.requests import ContainerRequest, PodRequest
from devplugin.allocation.scheduler_choice import Choice, scheduler_choice
from devplugin.allocation.selected_gpus import excluded_gpus
from devplugin.allocation.units import Kind
from devplugin.allocation.unreserved import cap
from devplugin.allocation.view_sync import with_resync
from devplugin.allocation.which_container import Found

log = logging.getLogger(ALLOCATOR_LOG)
PLANNED = "planned with the pod's other containers"  # the source of a GPU chosen by plan_together


@dataclass
class ContainerDecision:
    node: Node
    holdings: Holdings
    admissions: Admissions
    links: Links

    def place(self, found: Found, kind: Kind, avail: Mapping[str, set[str]] | None) -> Decision:
        """Place the whole container now; a refusal reaches its pod, and the container is not matched again for a
        while (admissions.REFUSED_TTL_S)."""
        try:
            return self._open(found, kind, avail)
        except RequestError as exc:
            self.admissions.refuse(found.pod.uid, found.container.name)
            self.links.reporter.refused(found.pod, found.container.name, str(exc))
            raise

    def _open(self, found: Found, kind: Kind, avail: Mapping[str, set[str]] | None) -> Decision:
        pod, container = found.pod, found.container
        key = key_of(pod, container)
        what = f"container {key}"
        its = asked(self.node, pod, container)
        need = need_of(self.node, its.per_gpu, its.gpus, container)
        room = Room(self.node, self.holdings, self.links.healthy, kind, avail, excluded_gpus(pod, self.node))
        reporter = self.links.reporter
        if found.fixed is not None:
            placement_gpus, source, override = found.fixed, "devices reused from an init container", ""
        else:
            choice, problem = scheduler_choice(pod, container, self.node)
            if problem:
                reporter.warning(pod, "GPUChoiceUnreadable", f"{what}: {problem}; placing by node policy")
            if choice is None and not container.init:
                choice = self._pod_plan(pod, container, room, need)
            try:
                placement = with_resync(self.links.resync, lambda: place(room, need, choice))
            except NoRoom as exc:
                raise NoRoom(f"{what}: {exc}", reason=exc.reason) from None
            placement_gpus, source, override = placement.gpus, placement.source, placement.override
        dec = Decision(gpus=placement_gpus, key=key, pod=pod, container=container, request=its.request,
                       per_gpu=its.per_gpu, source=source, exact=found.exact, reused_from=found.reused_from,
                       unreserved={u: cap(self.holdings.free(Kind.CORE, u)) for u in placement_gpus}
                       if need.unreserved else {})
        if self.holdings.get(dec.dir_name) is not None:  # its name went to a container placed for it on a guess
            dec.dir_name = f"{dec.dir_name[:71]}-{uuidlib.uuid4().hex[:8]}"
        if override:
            log.warning("%s: %s", what, override, extra={"fields": {"pod": pod.key, "container": container.name}})
            reporter.warning(pod, "GPUChoiceOverridden", f"{what}: {override}")
        self.admissions.latest = dec
        log.info("%s: placed on GPU %s (%s)", what, ",".join(str(self.node.by_uuid[u].index) for u in dec.gpus),
                 source, extra={"fields": {"pod": pod.key, "container": container.name, "gpu": ",".join(dec.gpus),
                                           "request": {k.value: n for k, n in its.request.items()}}})
        return dec

    def _pod_plan(self, pod: PodRequest, container: ContainerRequest, room: Room, need: Need) -> Choice | None:
        """Without a scheduler's choice, a pod's app containers are planned together on the first call of the first
        one (node policy alone could put it on the only GPU with room for a later one); later containers follow the
        plan as they would a choice (and the node's policy where it no longer fits)."""
        plans = self.admissions.plans
        plan = plans.get(pod.uid)
        if plan is not None and container.name in plan:
            planned = plan.pop(container.name)
            if not plan:
                del plans[pod.uid]
            return Choice(planned, PLANNED)
        taken = self.admissions.taken(self.holdings)
        recorded = recorded_containers(pod)
        later = [ct for ct in pod.containers if not ct.init and ct.wants_gpu and ct.position > container.position
                 and (pod.uid, ct.name) not in taken and ct.name not in recorded]
        if not later:
            return None
        needs = [need]
        for ct in later:
            try:
                theirs = asked(self.node, pod, ct)
            except RequestError:
                return None  # refused on its own call, with its own message
            needs.append(need_of(self.node, theirs.per_gpu, theirs.gpus, ct))
        together = plan_together(room, needs)
        if together is None:
            return None
        plans[pod.uid] = {ct.name: gpus for ct, gpus in zip(later, together[1:], strict=True)}
        return Choice(together[0], PLANNED)
