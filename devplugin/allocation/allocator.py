"""GetPreferredAllocation and Allocate as plain functions of the node, its view and the pods bound to it.

The gRPC servicers are thin wrappers over `Allocator.preferred` and `Allocator.allocate`; tests call these
directly. On the first call of a container's admission the pod cache says which container it is (identity.py);
its whole request is placed at once (planner.py) and every later call for it is answered from that decision,
whatever order the kubelet calls the resources in. Without a pod cache, or when the container cannot be found
within the lookup budget, the daemon falls back to node-local pairing (fallback.py, pairing.py) and says so.
PodResources keeps the node view in step with the kubelet (view_sync.py); the interfaces are in ports.py.

All state changes happen under one lock (the kubelet serialises admissions anyway). Nothing is committed before
everything that can fail has succeeded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from devplugin.allocation.choice import scheduler_choice
from devplugin.allocation.decision import ContainerKey, Decision, key_of
from devplugin.allocation.envs import decision_envs, shim_envs
from devplugin.allocation.errors import NoRoom, PairingConflict, RequestError
from devplugin.allocation.fallback import PARTNER_MINIMUM, PairingFallback, _check_size
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.identity import find_container, next_app_container
from devplugin.allocation.idsets import gpu_label, group_ids, id_index
from devplugin.allocation.node import Node
from devplugin.allocation.pairing import PairingBook
from devplugin.allocation.placement import RecentShares, pick_units
from devplugin.allocation.planner import Need, Room, place
from devplugin.allocation.ports import Grant, HeldDevices, MountProvider, MountSpec, PodLookup, Reporter
from devplugin.allocation.requests import (
    ContainerRequest,
    PodRequest,
    PodRequestError,
    check_core,
    per_gpu_share,
)
from devplugin.allocation.units import Kind
from devplugin.allocation.view_sync import ViewSync

log = logging.getLogger(__name__)

T = TypeVar("T")
REFUSED_TTL_S = 300.0  # a refused container is not matched again while its pod still looks pending
# How a pod lookup ends: the cached pods named the container, a direct LIST did, the apiserver answered but no
# pending container matches, or it did not answer within the budget (the last two place by node-local pairing).
LOOKUP_OUTCOMES = ("cache", "direct", "not_found", "no_answer")


@dataclass
class Allocator(PairingFallback, ViewSync):
    node: Node
    pair_window_s: float = 1.0
    mounts: MountProvider | None = None
    lookup: PodLookup | None = None
    reporter: Reporter = field(default_factory=Reporter)
    lookup_budget_s: float = 0.3
    healthy: Callable[[str], bool] = field(default=lambda uuid: True)
    # Re-reads the kubelet's PodResources into the node view (Allocator.reconcile); called before a refusal for lack
    # of room, since only a call of the same resource shows its devices free again (a gpu-count pod that ended
    # frees its GPU for gpu-mem too, but no gpu-count call may come to say so).
    resync: Callable[[], object] | None = None
    refresh: Callable[[], object] | None = None  # resync() unless the view was read from the kubelet a moment ago
    # Told how each pod lookup ended (LOOKUP_OUTCOMES), for metrics; called under the lock, must not block.
    on_lookup: Callable[[str], object] = field(default=lambda outcome: None)

    def __post_init__(self) -> None:
        self.recent = RecentShares(PARTNER_MINIMUM)
        self.holdings = Holdings(self.node)
        self.book = PairingBook(self.pair_window_s)
        self._latest: Decision | None = None  # the known container being admitted now
        self._refused: dict[tuple[str, str], float] = {}
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

    def pod_ended(self, pod_uid: str) -> None:
        """The pod cache saw a pod finish or go: its units come back."""
        with self._lock:
            gone = self.holdings.drop_pod(pod_uid)
            if self._latest is not None and self._latest.key and self._latest.key.pod_uid == pod_uid:
                self._latest = None
            if gone:
                log.info("pod ended: %d container(s) released their devices", len(gone),
                         extra={"fields": {"pod_uid": pod_uid,
                                           "containers": ",".join(str(h.key) for h in gone)}})
                self.reporter.occupancy_changed(self.holdings)

    # ================================================================== which container
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
        if found is not None:
            pod, container, fixed, reused_from = found
        else:
            match = self._find(kind, amount, taken)
            if match is None:
                return None
            pod, container = match
        try:
            dec = self._open(pod, container, kind, avail, fixed)
        except RequestError as exc:
            self._refused[(pod.uid, container.name)] = time.monotonic()
            self.reporter.refused(pod, container.name, str(exc))
            raise
        dec.reused_from = reused_from
        return dec

    def _find(self, kind: Kind, amount: int, taken: set[tuple[str, str]]) -> tuple[PodRequest, ContainerRequest] | None:
        assert self.lookup is not None
        pods = self.lookup.pods()
        match = find_container(pods, kind.value, amount, taken) if pods is not None else None
        if match is not None:
            self.on_lookup("cache")
        else:
            fresh = self.lookup.fetch_now(self.lookup_budget_s)
            match = find_container(fresh, kind.value, amount, taken) if fresh is not None else None
            self.on_lookup("direct" if match is not None else "no_answer" if fresh is None else "not_found")
            if match is None:
                # named, and its pod told, once PodResources and the pod cache can name it (ViewSync.reconcile)
                why = ("the apiserver did not answer within the lookup budget" if fresh is None
                       else f"no pending container on this node asks for {amount} {self.node.resource_name(kind)}")
                log.warning("placing without pod identity: %s; using node-local pairing", why,
                            extra={"fields": {"resource": self.node.resource_name(kind), "amount": amount}})
        return match

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
            if pod is None or owner is None or not owner.init:
                continue
            app = next_app_container(pod, kind.value, amount, taken)
            if app is not None:
                return pod, app, tuple(sorted(h.gpus(), key=lambda u: self.node.by_uuid[u].index)), h.key
        return None

    def _open(self, pod: PodRequest, container: ContainerRequest, kind: Kind,
              avail: Mapping[str, set[str]] | None, fixed: tuple[str, ...] | None) -> Decision:
        """Place the whole container now: every resource it asks for, on the same GPU(s)."""
        key = key_of(pod, container)
        what = f"container {key}"
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
        need = Need(per_gpu={k: n for k, n in per_gpu.items() if n}, gpus=gpus, whole=bool(container.count))
        room = Room(self.node, self.holdings, self.healthy, kind, avail)
        if fixed is not None:
            placement_gpus, source, override = fixed, "devices reused from an init container", ""
        else:
            choice, problem = scheduler_choice(pod, container, self.node)
            if problem:
                self.reporter.warning(pod, "GPUChoiceUnreadable", f"{what}: {problem}; placing by node policy")
            try:
                placement = self._with_resync(lambda: place(room, need, choice))
            except NoRoom as exc:
                raise NoRoom(f"{what}: {exc}") from None
            placement_gpus, source, override = placement.gpus, placement.source, placement.override
        dec = Decision(gpus=placement_gpus, key=key, pod=pod, container=container, request=request,
                       per_gpu={k: (1 if k is Kind.COUNT else per_gpu[k]) for k in request}, source=source)
        if override:
            log.warning("%s: %s", what, override, extra={"fields": {"pod": pod.key, "container": container.name}})
            self.reporter.warning(pod, "GPUChoiceOverridden", f"{what}: {override}")
        self._latest = dec
        log.info("%s: placed on GPU %s (%s)", what, ",".join(str(self.node.by_uuid[u].index) for u in dec.gpus),
                 source, extra={"fields": {"pod": pod.key, "container": container.name, "gpu": ",".join(dec.gpus),
                                           "request": {k.value: n for k, n in request.items()}}})
        return dec

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
        envs = decision_envs(self.node, dec)
        mounts = self._mounts(dec, kind, ids)
        shim_envs(envs, mounts)
        self.holdings.add(dec.dir_name, dec.key, kind, groups)
        dec.allocated[kind] = list(ids)
        if dec.complete:
            self.reporter.placed(dec, self.node)
        self.reporter.occupancy_changed(self.holdings)
        self._log_grant(dec, kind, ids)
        return Grant(dec.gpus, tuple(ids), envs, mounts, dec)

    def _recheck(self, dec: Decision, kind: Kind, groups: Mapping[str, set[str]], ids: Sequence[str]) -> None:
        """Allocate trusts nothing earlier calls said: no device given twice, no whole GPU with slices on it."""
        res = self.node.resource_name(kind)
        allowed = {dec.dir_name}
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
