"""GetPreferredAllocation and Allocate as plain functions of the node, its view and the pods bound to it.

The gRPC servicers are thin wrappers over `Allocator.preferred` and `Allocator.allocate`; tests call these
directly. On the first call of a container's admission the pod cache says which container it is (identity.py);
its whole request is placed at once (planner.py) and every later call for it is answered from that decision,
whatever order the kubelet calls the resources in. When several pending containers ask alike (a burst), the first
call's container is the likeliest of them, a guess: the kubelet records each resource's devices before it asks
for the container's next one, so the next call reads PodResources and takes the container's exact identity from
it (re-keying the decision when the guess was wrong: the container stays on the GPU its first resource got, or is
refused with an Event, never split). Each call's envs say only what its own device IDs say, so a guess never
reaches a container's env, and nothing is recorded on a pod for a guess. Without a pod cache, or when the container
cannot be found within the lookup budget, the daemon falls back to node-local pairing (fallback.py, pairing.py) and
says so. PodResources keeps the node view in step with the kubelet (view_sync.py); the interfaces are in ports.py.

All state changes happen under one lock (the kubelet serialises admissions anyway). Nothing is committed before
everything that can fail has succeeded.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import TypeVar

from devplugin.allocation.choice import Choice, scheduler_choice
from devplugin.allocation.decision import ContainerKey, Decision, key_of
from devplugin.allocation.envs import call_envs, shim_envs
from devplugin.allocation.errors import NoRoom, PairingConflict, RequestError
from devplugin.allocation.fallback import PARTNER_MINIMUM, PairingFallback, _check_size
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.identity import candidates, next_app_container, recorded_containers
from devplugin.allocation.idsets import gpu_label, group_ids, id_index
from devplugin.allocation.node import Node
from devplugin.allocation.pairing import PairingBook
from devplugin.allocation.placement import RecentShares, pick_units
from devplugin.allocation.planner import Need, Room, place, plan_together
from devplugin.allocation.ports import (
    Grant,
    HeldDevices,
    KubeletListing,
    MountProvider,
    MountSpec,
    PodLookup,
    Reporter,
)
from devplugin.allocation.requests import (
    ContainerRequest,
    PodRequest,
    PodRequestError,
    check_core,
    per_gpu_share,
)
from devplugin.allocation.selected_gpus import excluded_gpus
from devplugin.allocation.units import Kind
from devplugin.allocation.unreserved import MIN_UNRESERVED, cap, reserves_none
from devplugin.allocation.view_sync import ViewSync

log = logging.getLogger(__name__)

T = TypeVar("T")
REFUSED_TTL_S = 300.0  # a refused container is not matched again while its pod still looks pending
# How a pod lookup ends: the cached pods named the container, a direct LIST did, the apiserver answered but no
# pending container matches, or it did not answer within the budget (the last two place by node-local pairing).
LOOKUP_OUTCOMES = ("cache", "direct", "not_found", "no_answer")
PLANNED = "planned with the pod's other containers"  # the source of a GPU chosen by plan_together


@dataclass
class Allocator(PairingFallback, ViewSync):
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
    # second call of a container placed by node-local pairing needs no more (PairingFallback._listed_pods).
    read_pods: Callable[[], frozenset[tuple[str, str]] | None] | None = None

    def __post_init__(self) -> None:
        self.recent = RecentShares(PARTNER_MINIMUM)
        self.holdings = Holdings(self.node)
        self.book = PairingBook(self.pair_window_s)
        self._latest: Decision | None = None  # the known container being admitted now
        self._refused: dict[tuple[str, str], float] = {}
        self._plans: dict[str, dict[str, tuple[str, ...]]] = {}  # pod UID -> later app container -> its GPUs
        self._forgotten: set[tuple[str, str]] = set()  # see ViewSync.kubelet_restarted
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
            self._observe(kind, avail, must_include)
            dec = None
            try:
                # the container first, so that a refusal of its request reaches its pod as an Event
                dec = self._decision_for(kind, size, must_include, avail)
                if dec is not None:
                    return self._known_preferred(dec, kind, avail, must, size)
                _check_size(self.node, kind, size)
                total = sum(len(v) for v in avail.values())
                if total < size:
                    raise NoRoom(f"{res}: {size} requested but only {total} available on this node")
                return self._anonymous_preferred(kind, avail, must, size)
            except RequestError as exc:
                self._refuse(dec, exc)
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
                dec = self._decision_for(kind, len(ids), ids, None)
                if dec is not None:
                    return self._known_allocate(dec, kind, ids, groups)
                return self._anonymous_allocate(kind, ids, groups)
            except RequestError as exc:
                self._refuse(dec, exc)
                raise

    # ================================================================== the node view
    def _observe(self, kind: Kind, avail: Mapping[str, set[str]], must_include: Sequence[str]) -> None:
        freed = self.holdings.observe_available(kind, avail, must_include)
        if freed:
            if time.monotonic() < self._readmits_until:
                # the restarted kubelet offers a known container's devices again: it forgot that allocation and
                # may admit the container again (view_sync.READMIT_WINDOW_S)
                self._forgotten.update((h.key.pod_uid, h.key.container) for h in freed if h.key is not None)
            log.info("%d container(s) released their devices (the kubelet offers them again)", len(freed),
                     extra={"fields": {"resource": self.node.resource_name(kind),
                                       "containers": ",".join(str(h.key or h.holder) for h in freed)}})
            if self._latest is not None and any(h.holder == self._latest.dir_name for h in freed):
                self._latest = None
            self.reporter.occupancy_changed(self.holdings)
        self.book.forget_rolled_back(kind, avail)

    def snapshot(self, read: Callable[[Holdings], T]) -> T:
        """read(holdings) with no admission in flight (for publishers off the admission path)."""
        with self._lock:
            return read(self.holdings)

    def guesses(self) -> int:
        """Containers placed as the likeliest of several asking alike that PodResources has not named yet: not
        recorded on their pods until it does (ViewSync.reconcile)."""
        with self._lock:
            return sum(1 for h in self.holdings.holders() if h.key is not None and not h.exact)

    def pod_ended(self, pod_uid: str) -> None:
        """The pod cache saw a pod finish or go: its units come back."""
        with self._lock:
            gone = self.holdings.drop_pod(pod_uid)
            self._plans.pop(pod_uid, None)
            if self._latest is not None and self._latest.key and self._latest.key.pod_uid == pod_uid:
                self._latest = None
            if gone:
                log.info("pod ended: %d container(s) released their devices", len(gone),
                         extra={"fields": {"pod_uid": pod_uid,
                                           "containers": ",".join(str(h.key) for h in gone)}})
                self.reporter.occupancy_changed(self.holdings)

    # ================================================================== which container
    def _forgotten_by_kubelet(self) -> set[tuple[str, str]]:
        """Containers recorded on their pod whose devices the restarted kubelet offered again (empty once
        READMIT_WINDOW_S has passed since its restart)."""
        if self._forgotten and time.monotonic() >= self._readmits_until:
            self._forgotten.clear()
        return self._forgotten

    def _taken(self) -> set[tuple[str, str]]:
        now = time.monotonic()
        for k, t in list(self._refused.items()):
            if now - t > REFUSED_TTL_S:
                del self._refused[k]
        taken = {(h.key.pod_uid, h.key.container) for h in self.holdings.holders() if h.key is not None}
        taken.update(self._refused)
        if self._latest is not None and self._latest.key is not None:
            taken.add((self._latest.key.pod_uid, self._latest.key.container))
        return taken

    def _decision_for(self, kind: Kind, amount: int, ids: Sequence[str],
                      avail: Mapping[str, set[str]] | None) -> Decision | None:
        """The known decision this call belongs to (opening one if needed), or None for node-local pairing."""
        latest = self._latest
        if (latest is not None and latest.known and latest.allocated and kind not in latest.allocated
                and not latest.complete and (not latest.exact or not latest.pending(kind, amount))):
            # the next resource of the container being admitted: the kubelet lists its first one by now
            latest = self._identify(latest)
        if latest is not None and latest.pending(kind, amount):
            latest.touched = time.monotonic()
            return latest
        if self.lookup is None:
            return None
        if self.book.joinable(kind, for_allocate=avail is None):
            return None  # the second call of a container placed without its pod: do not wait for the lookup again
        taken = self._taken()
        found = self._reuse(kind, amount, ids, taken)
        fixed: tuple[str, ...] | None = None
        reused_from = None
        exact = True
        if found is not None:
            pod, container, fixed, reused_from = found
        else:
            match = self._find(kind, amount, taken)
            if match is None:
                return None
            pod, container, exact = match
        try:
            dec = self._open(pod, container, kind, avail, fixed, exact)
        except RequestError as exc:
            self._refused[(pod.uid, container.name)] = time.monotonic()
            self.reporter.refused(pod, container.name, str(exc))
            raise
        dec.reused_from = reused_from
        return dec

    def _find(self, kind: Kind, amount: int, taken: set[tuple[str, str]]
              ) -> tuple[PodRequest, ContainerRequest, bool] | None:
        """(pod, container, exact): the container this first call is for; exact when no other pending container
        asks alike (after reading the kubelet's PodResources: containers it lists are not pending)."""
        assert self.lookup is not None
        pods = self.lookup.pods()
        found = self._candidates(pods, kind, amount, taken)
        if found:
            self.on_lookup("cache")
        else:
            fresh = self.lookup.fetch_now(self.lookup_budget_s)
            if fresh is None and self.lookup_patience_s > 0:
                fresh = self.lookup.fetch_now(self.lookup_patience_s)
            found = self._candidates(fresh, kind, amount, taken)
            self.on_lookup("direct" if found else "no_answer" if fresh is None else "not_found")
            if not found:
                # named, and its pod told, once PodResources and the pod cache can name it (ViewSync.reconcile)
                why = ("the apiserver did not answer within the lookup budget" if fresh is None
                       else f"no pending container on this node asks for {amount} {self.node.resource_name(kind)}")
                log.warning("placing without pod identity: %s; using node-local pairing", why,
                            extra={"fields": {"resource": self.node.resource_name(kind), "amount": amount}})
                return None
        pod, container = found[0]
        return pod, container, len(found) == 1

    def _candidates(self, pods: list[PodRequest] | None, kind: Kind, amount: int,
                    taken: set[tuple[str, str]]) -> list[tuple[PodRequest, ContainerRequest]]:
        if pods is None:
            return []
        again = self._forgotten_by_kubelet()
        found = candidates(pods, kind.value, amount, taken, again)
        if len(found) > 1 and self.resync is not None and self.resync():
            # several ask alike: the containers the kubelet lists holding devices are not pending, and those
            # placed on a guess are named now
            found = candidates(pods, kind.value, amount, self._taken(), again)
        return found

    def _identify(self, dec: Decision) -> Decision | None:
        """The container being admitted, as the kubelet's PodResources names it (it lists the devices of the
        container's first resource before asking for the next): `dec` confirmed, re-keyed to the container that
        really holds its devices, or `dec` unchanged when the kubelet cannot be asked or does not list them."""
        if self.resync is None or not self.resync():
            return self._latest
        h = self.holdings.get(dec.dir_name)
        if h is None or h.key is None or not h.exact or self._latest is not dec:
            return self._latest
        if h.key == dec.key:
            dec.exact = True
            return dec
        pods = self.lookup.pods() if self.lookup else None
        pod = next((p for p in pods or () if p.uid == h.key.pod_uid), None)
        container = pod.container(h.key.container) if pod else None
        if pod is None or container is None:
            return dec
        guessed = dec.label()
        try:
            request, per_gpu, gpus = self._request_of(pod, container)
            excluded = excluded_gpus(pod, self.node)
        except RequestError as exc:
            self._latest = None
            self.reporter.refused(pod, container.name, str(exc))
            raise
        gpus_txt = ", ".join(gpu_label(self.node, u) for u in dec.gpus)
        banned = [u for u in dec.gpus if u in excluded]
        if gpus != len(dec.gpus) or banned:
            self._latest = None
            why = (f"its pod's GPU selection excludes {gpu_label(self.node, banned[0])} ({excluded[banned[0]]})"
                   if banned else f"it needs {gpus} GPU(s)")
            conflict = PairingConflict(
                f"container {key_of(pod, container)}: its first resource was placed on {gpus_txt} for {guessed}, "
                f"which asks alike, but {why}; refusing rather than splitting it (the pod can be created again)",
                reason="identity")
            self.reporter.refused(pod, container.name, str(conflict))
            raise conflict
        fixed = replace(dec, key=h.key, pod=pod, container=container, request=request, per_gpu=per_gpu,
                        exact=True, source=f"where its first resource went, placed for {guessed} (which asks alike)")
        log.warning("container %s: its first resource was placed for %s, which asks alike; the kubelet's "
                    "PodResources names it: its other resources follow on GPU %s", h.key, guessed,
                    ",".join(str(self.node.by_uuid[u].index) for u in dec.gpus),
                    extra={"fields": {"pod": pod.key, "container": container.name, "gpu": ",".join(dec.gpus)}})
        self.reporter.warning(pod, "GPUPlacedForAnotherContainer",
                              f"container {container.name}: its first resource was placed on "
                              f"{', '.join(gpu_label(self.node, u) for u in dec.gpus)} for {guessed} (several "
                              "pending containers ask alike); the rest of it goes to the same GPU")
        self._latest = fixed
        return fixed

    def _reuse(self, kind: Kind, amount: int, ids: Sequence[str], taken: set[tuple[str, str]]
               ) -> tuple[PodRequest, ContainerRequest, tuple[str, ...], ContainerKey] | None:
        """The kubelet hands an init container's devices to the pod's app container (it does not ask us which):
        the call names devices an init container holds."""
        for holder in sorted(self.holdings.owners(ids)):
            h = self.holdings.get(holder)
            if h is None or h.key is None:
                continue
            pods = self.lookup.pods() if self.lookup else None
            pod = next((p for p in pods or () if p.uid == h.key.pod_uid), None)
            owner = pod.container(h.key.container) if pod else None
            if pod is None or owner is None or not owner.init or owner.sidecar:
                continue  # a sidecar keeps its devices for the pod's life: the kubelet hands on only an init's
            app = next_app_container(pod, kind.value, amount, taken, owner.position)
            if app is not None:
                return pod, app, tuple(sorted(h.gpus(), key=lambda u: self.node.by_uuid[u].index)), h.key
        return None

    def _request_of(self, pod: PodRequest, container: ContainerRequest
                    ) -> tuple[dict[Kind, int], dict[Kind, int], int]:
        """(whole-container amounts, units of each on each GPU, GPU count); RequestError for what cannot be
        served."""
        what = f"container {key_of(pod, container)}"
        if container.count and (container.mem or container.core):
            raise RequestError(f"{what} asks for gpu-count together with gpu-mem / gpu-core.percentage: ask for "
                               "whole GPUs (gpu-count) alone, or share N GPUs with the pod label "
                               "aliyun.com/gpu-count: \"N\" and gpu-mem only", reason="count_with_share")
        gpus = container.count or (pod.gpus_per_container if (container.mem or container.core) else 1)
        try:
            mem, core = per_gpu_share(container, gpus) if not container.count else (0, 0)
        except PodRequestError as exc:
            raise RequestError(f"pod {pod.key}: {exc}", reason="pod_request") from None
        if container.core and Kind.CORE in self.node.kinds:
            problem = check_core(container.core, gpus)
            if problem:
                raise RequestError(f"{what}: {problem}", reason="core_share")
        request = {k: n for k, n in ((Kind.MEM, container.mem), (Kind.CORE, container.core),
                                     (Kind.COUNT, container.count)) if n and k in self.node.kinds}
        per_gpu = {Kind.MEM: mem, Kind.CORE: core if Kind.CORE in self.node.kinds else 0}
        return request, {k: (1 if k is Kind.COUNT else per_gpu[k]) for k in request}, gpus

    def _open(self, pod: PodRequest, container: ContainerRequest, kind: Kind,
              avail: Mapping[str, set[str]] | None, fixed: tuple[str, ...] | None, exact: bool = True) -> Decision:
        """Place the whole container now: every resource it asks for, on the same GPU(s)."""
        key = key_of(pod, container)
        what = f"container {key}"
        request, per_gpu, gpus = self._request_of(pod, container)
        need = self._need(per_gpu, gpus, container)
        room = Room(self.node, self.holdings, self.healthy, kind, avail, excluded_gpus(pod, self.node))
        if fixed is not None:
            placement_gpus, source, override = fixed, "devices reused from an init container", ""
        else:
            choice, problem = scheduler_choice(pod, container, self.node)
            if problem:
                self.reporter.warning(pod, "GPUChoiceUnreadable", f"{what}: {problem}; placing by node policy")
            if choice is None and not container.init:
                choice = self._pod_plan(pod, container, room, need)
            try:
                placement = self._with_resync(lambda: place(room, need, choice))
            except NoRoom as exc:
                raise NoRoom(f"{what}: {exc}", reason=exc.reason) from None
            placement_gpus, source, override = placement.gpus, placement.source, placement.override
        dec = Decision(gpus=placement_gpus, key=key, pod=pod, container=container, request=request,
                       per_gpu=per_gpu, source=source, exact=exact,
                       unreserved={u: cap(self.holdings.free(Kind.CORE, u)) for u in placement_gpus}
                       if need.unreserved else {})
        if self.holdings.get(dec.dir_name) is not None:  # its name went to a container placed for it on a guess
            dec.dir_name = f"{dec.dir_name[:71]}-{uuidlib.uuid4().hex[:8]}"
        if override:
            log.warning("%s: %s", what, override, extra={"fields": {"pod": pod.key, "container": container.name}})
            self.reporter.warning(pod, "GPUChoiceOverridden", f"{what}: {override}")
        self._latest = dec
        log.info("%s: placed on GPU %s (%s)", what, ",".join(str(self.node.by_uuid[u].index) for u in dec.gpus),
                 source, extra={"fields": {"pod": pod.key, "container": container.name, "gpu": ",".join(dec.gpus),
                                           "request": {k.value: n for k, n in request.items()}}})
        return dec

    def _pod_plan(self, pod: PodRequest, container: ContainerRequest, room: Room, need: Need) -> Choice | None:
        """Without a scheduler's choice, a pod's app containers are planned together on the first call of the first
        one (node policy alone could put it on the only GPU with room for a later one); later containers follow the
        plan as they would a choice (and the node's policy where it no longer fits)."""
        plan = self._plans.get(pod.uid)
        if plan is not None and container.name in plan:
            planned = plan.pop(container.name)
            if not plan:
                del self._plans[pod.uid]
            return Choice(planned, PLANNED)
        taken = self._taken()
        recorded = recorded_containers(pod)
        later = [ct for ct in pod.containers if not ct.init and ct.wants_gpu and ct.position > container.position
                 and (pod.uid, ct.name) not in taken and ct.name not in recorded]
        if not later:
            return None
        needs = [need]
        for ct in later:
            try:
                _, per_gpu, count = self._request_of(pod, ct)
            except RequestError:
                return None  # refused on its own call, with its own message
            needs.append(self._need(per_gpu, count, ct))
        together = plan_together(room, needs)
        if together is None:
            return None
        self._plans[pod.uid] = {ct.name: gpus for ct, gpus in zip(later, together[1:], strict=True)}
        return Choice(together[0], PLANNED)

    def _need(self, per_gpu: Mapping[Kind, int], gpus: int, container: ContainerRequest) -> Need:
        """What a container needs on each of its GPUs, a container that reserves no compute on a core_mem node
        included (some compute nobody reserved: unreserved.py)."""
        shares: dict[Kind, int] = {k: n for k, n in per_gpu.items() if n and k is not Kind.COUNT}
        unpaid = not container.count and reserves_none(self.node.mode, shares.get(Kind.MEM, 0),
                                                       shares.get(Kind.CORE, 0))
        return Need(per_gpu=shares, gpus=gpus, whole=bool(container.count),
                    unreserved=MIN_UNRESERVED if unpaid else 0)

    def _with_resync(self, attempt: Callable[[], T]) -> T:
        """attempt(); on NoRoom, once more after re-reading PodResources (the view may be stale for resources the
        kubelet has not called since they were freed)."""
        try:
            return attempt()
        except NoRoom:
            if self.resync is None:
                raise
            self.resync()
            return attempt()

    # ================================================================== known containers
    def _known_preferred(self, dec: Decision, kind: Kind, avail: Mapping[str, set[str]],
                         must: Mapping[str, set[str]], size: int) -> list[str]:
        res = self.node.resource_name(kind)
        stray = [u for u in must if u not in dec.gpus]
        if stray:
            raise PairingConflict(
                f"{res}: the kubelet requires devices on {gpu_label(self.node, stray[0])} but container "
                f"{dec.label()} is placed on {', '.join(gpu_label(self.node, u) for u in dec.gpus)}")
        out: list[str] = []
        for uuid in dec.gpus:
            per = dec.per_gpu[kind]
            free = avail.get(uuid, set())
            if len(free) < per:
                raise PairingConflict(
                    f"{res}: container {dec.label()} needs {per} on {gpu_label(self.node, uuid)} (chosen for all "
                    f"of its resources: {dec.source}) but the kubelet offers only {len(free)} there; a container's "
                    "gpu-mem and gpu-core.percentage must fit on one GPU: lower the request or free room on it")
            out += pick_units(free, must.get(uuid, set()), per, key=id_index(self.node, kind).unit.__getitem__)
        if len(out) != size:
            raise RequestError(f"{res}: container {dec.label()} asks for {dec.request.get(kind, 0)} but the kubelet "
                               f"asks us to choose {size}")
        dec.preferred[kind] = out
        return out

    def _known_allocate(self, dec: Decision, kind: Kind, ids: Sequence[str],
                        groups: Mapping[str, set[str]]) -> Grant:
        res = self.node.resource_name(kind)
        if set(groups) != set(dec.gpus) or any(len(v) != dec.per_gpu[kind] for v in groups.values()):
            got = ", ".join(f"{len(v)} on {gpu_label(self.node, u)}" for u, v in groups.items())
            want = ", ".join(f"{dec.per_gpu[kind]} on {gpu_label(self.node, u)}" for u in dec.gpus)
            raise PairingConflict(
                f"{res}: container {dec.label()} is placed as {want} ({dec.source}) but the kubelet allocates {got}; "
                "all of a container's resources must be on the same GPU(s) (the kubelet chose without this "
                "plugin's preference; retry the pod)", reason="kubelet_choice")
        self._recheck(dec, kind, groups, ids)
        envs = call_envs(self.node, dec, kind, groups)
        mounts = self._mounts(replace(dec, allocated={**dec.allocated, kind: list(ids)}), kind, ids)
        shim_envs(envs, mounts)
        self.holdings.add(dec.dir_name, dec.key, kind, groups, exact=dec.exact)
        dec.allocated[kind] = list(ids)
        if dec.complete:
            if dec.exact:
                self.reporter.placed(dec, self.node)
            else:  # recorded on its pod once PodResources names it (ViewSync.reconcile)
                self.on_guess()
        self.reporter.occupancy_changed(self.holdings)
        self._log_grant(dec, kind, ids)
        return Grant(dec.gpus, tuple(ids), envs, mounts, dec)

    def _recheck(self, dec: Decision, kind: Kind, groups: Mapping[str, set[str]], ids: Sequence[str],
                 reused: Set[str] = frozenset()) -> None:
        """Allocate trusts nothing earlier calls said: no device given twice, no whole GPU with slices on it.
        `reused`: holders whose devices the kubelet hands on to this container (an init container's)."""
        res = self.node.resource_name(kind)
        allowed = {dec.dir_name, *reused}
        if dec.reused_from is not None:
            allowed |= {h.holder for h in self.holdings.holders() if h.key == dec.reused_from}
        others = self.holdings.owners(ids) - allowed
        if others:
            other = self.holdings.get(sorted(others)[0])
            raise PairingConflict(f"{res}: device(s) of this request are already held by "
                                  f"{other.key if other and other.key else 'another container'}; refusing to give "
                                  "a device twice (restart the daemon if the kubelet and the daemon disagree)",
                                  reason="device_held")
        for uuid in groups:
            if kind is Kind.COUNT and self.holdings.shared(uuid):
                raise PairingConflict(f"{res}: {gpu_label(self.node, uuid)} holds shared containers; a whole GPU "
                                      "needs a GPU nobody shares")
            if kind is not Kind.COUNT and self.holdings.whole(uuid) and not (
                    dec.reused_from and uuid in self._gpus_of(dec.reused_from)):
                raise PairingConflict(f"{res}: {gpu_label(self.node, uuid)} is held whole by a gpu-count container")

    def _gpus_of(self, key: ContainerKey) -> set[str]:
        return {u for h in self.holdings.holders() if h.key == key for u in h.gpus()}

    def _mounts(self, dec: Decision, kind: Kind, ids: Sequence[str]) -> tuple[MountSpec, ...]:
        if self.mounts is None or kind is Kind.COUNT:
            return ()
        try:
            return tuple(self.mounts(dec, self.node, ids))
        except (OSError, ValueError) as exc:
            raise RequestError(
                f"{self.node.resource_name(kind)}: could not write the isolation files of container "
                f"{dec.label()}: {exc}; check the daemon's --shim-state-dir (free space, permissions)",
                reason="shim_files") from None

    def _refuse(self, dec: Decision | None, exc: RequestError) -> None:
        """A refused call makes the kubelet reject the pod: its decision must not catch the next container."""
        self.book.close()
        if dec is not None and dec.key is not None:
            self._refused[(dec.key.pod_uid, dec.key.container)] = time.monotonic()
            if self._latest is dec:
                self._latest = None
            self.reporter.refused(dec.pod, dec.key.container, str(exc))
        log.error("refused: %s", exc, extra={"fields": {"container": dec.label() if dec else "",
                                                        "code": exc.code.name}})

    def _log_grant(self, dec: Decision, kind: Kind, ids: Sequence[str]) -> None:
        # a known container's placement was logged once, whole, when it was decided: its grants are detail
        log.log(logging.DEBUG if dec.known else logging.INFO, "allocated %d %s on GPU %s to %s", len(ids),
                self.node.resource_name(kind), ",".join(str(self.node.by_uuid[u].index) for u in dec.gpus),
                dec.label(), extra={"fields": {"resource": self.node.resource_name(kind), "gpu": ",".join(dec.gpus),
                                               "devices": len(ids), "container": dec.label(),
                                               "state_dir": dec.dir_name}})


__all__ = ["Allocator", "Grant", "HeldDevices", "MountProvider", "MountSpec", "PodLookup", "Reporter"]
