"""GetPreferredAllocation and Allocate as plain functions of the node, its view and the pods bound to it.

The gRPC servicers are thin wrappers over `Allocator.preferred` and `Allocator.allocate`; tests call these
directly. On the first call of a container's admission the pod cache says which container it is (identity.py);
its whole request is placed at once (planner.py) and every later call for it is answered from that decision,
whatever order the kubelet calls the resources in. Without a pod cache, or when the container cannot be found
within the lookup budget, the daemon falls back to node-local pairing (pairing.py) and says so.

All state changes happen under one lock (the kubelet serialises admissions anyway). Nothing is committed before
everything that can fail has succeeded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from devplugin.allocation.choice import scheduler_choice
from devplugin.allocation.decision import ContainerKey, Decision, key_of, state_dir_name
from devplugin.allocation.envs import container_envs, decision_envs
from devplugin.allocation.errors import NoRoom, PairingConflict, RequestError
from devplugin.allocation.holdings import Holding, Holdings
from devplugin.allocation.identity import find_container, next_app_container, recorded_containers
from devplugin.allocation.idsets import gpu_label, group_ids, id_index
from devplugin.allocation.node import Node
from devplugin.allocation.pairing import PairingBook
from devplugin.allocation.placement import RecentShares, pick_gpu, pick_units, pick_whole_gpus
from devplugin.allocation.planner import Need, Room, place
from devplugin.allocation.requests import (
    ContainerRequest,
    PodRequest,
    PodRequestError,
    check_core,
    per_gpu_share,
)
from devplugin.allocation.units import CORE_STEP, CORE_UNITS_PER_GPU, Kind, encode_id

log = logging.getLogger(__name__)

T = TypeVar("T")
PARTNER_MINIMUM = {Kind.MEM: 1, Kind.CORE: CORE_STEP}
REFUSED_TTL_S = 300.0  # a refused container is not matched again while its pod still looks pending
# How a pod lookup ends: the cached pods named the container, a direct LIST did, the apiserver answered but no
# pending container matches, or it did not answer within the budget (the last two place by node-local pairing).
LOOKUP_OUTCOMES = ("cache", "direct", "not_found", "no_answer")


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class Grant:
    """What one Allocate gives a container."""

    gpus: tuple[str, ...]
    device_ids: tuple[str, ...]
    envs: dict[str, str]
    mounts: tuple[MountSpec, ...] = ()
    decision: Decision | None = None


# Called on each shared Allocate with (decision, node, this call's IDs) before anything is committed -> mounts;
# the shim delivery plugs in here.
MountProvider = Callable[[Decision, Node, Sequence[str]], Sequence[MountSpec]]


class HeldDevices(Protocol):
    """A container the kubelet lists as holding devices (PodResources); read only."""

    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def devices(self) -> Mapping[Kind, Sequence[str]]: ...


class PodLookup(Protocol):
    """The pods bound to this node (the pod cache)."""

    def pods(self) -> list[PodRequest] | None:
        """A snapshot without I/O; None while the cache has no view of the node's pods."""

    def fetch_now(self, budget_s: float) -> list[PodRequest] | None:
        """One direct read of the node's pods within the budget; None when the apiserver did not answer."""


class Reporter:
    """What the daemon tells the cluster (annotations, Events, node usage); the kube layer overrides it.
    Every method is called under the allocator's lock and must not block."""

    def placed(self, decision: Decision, node: Node) -> None:
        pass

    def refused(self, pod: PodRequest | None, container: str | None, message: str) -> None:
        pass

    def warning(self, pod: PodRequest, reason: str, message: str) -> None:
        pass

    def unidentified(self, kind: Kind, amount: int, why: str) -> None:
        pass

    def occupancy_changed(self, holdings: Holdings) -> None:
        pass

    def record_holding(self, pod: PodRequest, holding: Holding, node: Node) -> None:
        """Record on the pod a container learned from the kubelet (restart, or placed without lookup)."""


@dataclass
class Allocator:
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

    def restore(self, key: ContainerKey | None, holder: str, held: Mapping[Kind, Sequence[str]]) -> None:
        """A container the kubelet says holds these devices (PodResources after a restart)."""
        with self._lock:
            for kind, ids in held.items():
                known = id_index(self.node, kind).every
                strangers = [i for i in ids if i not in known]
                if strangers:
                    log.warning("ignoring %d held %s devices this node does not advertise, e.g. %r",
                                len(strangers), self.node.resource_name(kind), strangers[0])
                good = [i for i in dict.fromkeys(ids) if i in known]
                if good:
                    self.holdings.add(holder, key, kind, group_ids(self.node, kind, good, "held IDs"))
            self.reporter.occupancy_changed(self.holdings)

    def keep_only(self, held: Mapping[Kind, set[str]]) -> None:
        """PodResources lists every device the kubelet has given out: forget containers it no longer lists."""
        with self._lock:
            if self.holdings.keep_only(held):
                self.reporter.occupancy_changed(self.holdings)

    def reconcile(self, held: Sequence[HeldDevices], pods: Sequence[PodRequest] | None,
                  as_of: float | None = None) -> None:
        """The kubelet's PodResources (every container holding our devices, by namespace, pod and container name)
        joined with the pod cache: forget containers the kubelet no longer lists, learn those it lists that we do
        not know (after a restart), name containers placed without pod lookup, and write every decision that is
        not recorded on its pod yet. `as_of`: when PodResources was asked (containers placed since are kept)."""
        by_name = {(p.namespace, p.name): p for p in pods or () if not p.finished}
        with self._lock:
            every: dict[Kind, set[str]] = {k: set() for k in Kind}
            for entry in held:
                for kind, ids in entry.devices.items():
                    every[kind].update(ids)
            changed = bool(self.holdings.keep_only(every, as_of))
            for entry in held:
                changed |= self._reconcile_one(entry, by_name.get((entry.namespace, entry.pod)))
            if changed:
                self.reporter.occupancy_changed(self.holdings)

    def _reconcile_one(self, entry: HeldDevices, pod: PodRequest | None) -> bool:
        key = ContainerKey(pod.uid, entry.container, entry.namespace, entry.pod) if pod else None
        ids = [i for kind_ids in entry.devices.values() for i in kind_ids]
        owners = self.holdings.owners(ids)
        changed = False
        if not owners:
            holder = state_dir_name(key) if key else f"held-{abs(hash((entry.namespace, entry.pod, entry.container)))}"
            for kind, kind_ids in entry.devices.items():
                known = id_index(self.node, kind).every
                good = [i for i in dict.fromkeys(kind_ids) if i in known]
                if good:
                    self.holdings.add(holder, key, kind, group_ids(self.node, kind, good, "held IDs"))
                    changed = True
            owners = {holder}
            if key:
                log.info("container %s holds devices (learned from the kubelet)", key,
                         extra={"fields": {"pod": f"{key.namespace}/{key.pod}", "container": key.container}})
        if pod is None or key is None:
            return changed
        for holder in owners:
            h = self.holdings.get(holder)
            if h is None:
                continue
            if h.key is None:
                h.key = key
                self.reporter.warning(pod, "PlacedWithoutPodLookup",
                                      f"container {entry.container} was placed by node-local pairing because the "
                                      "apiserver could not be asked in time; its devices are recorded now")
            if h.key == key and entry.container not in recorded_containers(pod):
                self.reporter.record_holding(pod, h, self.node)
        return changed

    def mark_allocated(self, kind: Kind, ids: Sequence[str]) -> None:
        """Devices already held by containers we cannot name (PodResources without pod names)."""
        self.restore(None, f"held-{kind.code}-{len(self.holdings.holders())}", {kind: ids})

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
                why = ("the apiserver did not answer within the lookup budget" if fresh is None and pods is None
                       else f"no pending container on this node asks for {amount} {self.node.resource_name(kind)}")
                log.warning("placing without pod identity: %s; using node-local pairing", why,
                            extra={"fields": {"resource": self.node.resource_name(kind), "amount": amount}})
                self.reporter.unidentified(kind, amount, why)
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

    # ================================================================== node-local pairing (no pod identity)
    def _anonymous_preferred(self, kind: Kind, avail: dict[str, set[str]], must: dict[str, set[str]],
                             size: int) -> list[str]:
        if kind is Kind.COUNT:
            self.book.current(kind, for_allocate=False)
            return self._with_resync(lambda: self._preferred_whole(avail, must, size))
        res = self.node.resource_name(kind)
        if len(must) > 1:
            raise RequestError(f"{res}: must-include IDs span {len(must)} GPUs; one container's share is on one GPU")
        dec = self.book.current(kind, for_allocate=False)
        if dec is not None:
            target = dec.gpus[0]
            if must and target not in must:
                raise PairingConflict(
                    f"{res}: the kubelet requires devices on {gpu_label(self.node, next(iter(must)))} but this "
                    f"container's other resource is on {gpu_label(self.node, target)}"
                )
        elif must:
            target = next(iter(must))
        else:
            if self.refresh is not None:
                # placed blind: at least see the other resource as the kubelet does now (one local call)
                self.refresh()
            target = self._with_resync(lambda: self._place_anonymous(kind, avail, size))
        free = avail.get(target, set())
        if len(free) < size:
            other = next(iter(dec.preferred or dec.allocated)).value if dec else "request"
            raise PairingConflict(
                f"{res}: this container asks for {size} but {gpu_label(self.node, target)}, chosen for its "
                f"{other}, has only {len(free)} free; a container's gpu-mem and gpu-core.percentage must fit "
                "on one GPU: lower the request or free room on that GPU"
            )
        ids = pick_units(free, must.get(target, set()), size, key=id_index(self.node, kind).unit.__getitem__)
        if dec is None:
            dec = self.book.open((target,))
        dec.preferred[kind] = ids
        return ids

    def _place_anonymous(self, kind: Kind, avail: dict[str, set[str]], size: int) -> str:
        """Choose a GPU for a new container by the node's policy, leaving out GPUs it could not use."""
        partner = Kind.CORE if kind is Kind.MEM else Kind.MEM
        pair = partner in self.node.kinds and Kind.CORE in self.node.kinds
        usable = {uuid: len(units) for uuid, units in avail.items()
                  if not self.holdings.whole(uuid) and self.healthy(uuid)}
        target = None
        # The other half of the container comes later, its size unknown: first keep room for what recent
        # containers asked (replicas of one workload ask alike), then settle for the smallest possible share.
        for reserve in ((self.recent.reserve(partner), PARTNER_MINIMUM[partner]) if pair else (0,)):
            room = {u: free for u, free in usable.items() if self.holdings.free(partner, u) >= reserve}
            target = pick_gpu(self.node, room, size, self.node.placement)
            if target is not None:
                break
        if target is None:
            detail = ", ".join(
                f"GPU {self.node.by_uuid[u].index}: {len(avail.get(u, []))}"
                + (" (held whole)" if self.holdings.whole(u) else "")
                for u in self.node.by_uuid
            )
            raise NoRoom(
                f"{self.node.resource_name(kind)}: no single GPU has {size} free units ({detail}); a container's "
                "share must fit on one GPU: lower the request or wait for room"
            )
        return target

    def _preferred_whole(self, avail: dict[str, set[str]], must: dict[str, set[str]], size: int) -> list[str]:
        res = self.node.resource_name(Kind.COUNT)
        candidates = [u for u in avail if not self.holdings.shared(u) and self.healthy(u)]
        busy = [u for u in must if u not in candidates]
        if busy:
            raise PairingConflict(f"{res}: {gpu_label(self.node, busy[0])} is shared by other containers")
        chosen = pick_whole_gpus(self.node, candidates, list(must), size)
        if chosen is None:
            raise NoRoom(
                f"{res}: {size} whole GPU(s) requested but only {len(candidates)} have no shared containers "
                f"(of {len(avail)} not given whole); wait for shared pods to end or ask for fewer"
            )
        return [encode_id(u, Kind.COUNT) for u in chosen]

    def _anonymous_allocate(self, kind: Kind, ids: Sequence[str], groups: dict[str, set[str]]) -> Grant:
        res = self.node.resource_name(kind)
        if kind is Kind.COUNT:
            uuids = tuple(groups)
        else:
            if len(groups) > 1:
                names = ", ".join(str(self.node.by_uuid[u].index) for u in groups)
                raise RequestError(
                    f"{res}: IDs from GPUs {names} for a one-GPU request; a container's share must come from one "
                    "GPU (the kubelet picked them without this plugin's preference: check that the kubelet "
                    "calls GetPreferredAllocation)"
                )
            uuids = (next(iter(groups)),)
            _check_size(self.node, kind, len(ids))
        dec = self.book.current(kind, for_allocate=True)
        if dec is not None and dec.gpus != uuids:
            have = next(iter(dec.allocated or dec.preferred))
            raise PairingConflict(
                f"{res}: this container's {have.value} is on {gpu_label(self.node, dec.gpus[0])} but its "
                f"{kind.value} devices are on {gpu_label(self.node, uuids[0])}; both must share one GPU "
                "(retry the pod; if it keeps failing, the GPU it was scheduled for lacks room)"
            )
        target = dec if dec is not None else Decision(gpus=uuids)
        self._recheck(target, kind, groups, ids)
        trial = Decision(gpus=target.gpus, allocated={**target.allocated, kind: list(ids)}, dir_name=target.dir_name)
        envs = container_envs(self.node, kind, uuids, len(ids))
        mounts = self._mounts(trial, kind, ids)
        if dec is None:
            dec = self.book.adopt(target)
        self.holdings.add(dec.dir_name, None, kind, groups)
        self.book.allocated(dec, kind, list(ids))
        if kind is not Kind.COUNT:
            self.recent.add(kind, len(ids))
        self.reporter.occupancy_changed(self.holdings)
        self._log_grant(dec, kind, ids)
        return Grant(uuids, tuple(ids), envs, mounts, dec)


def _check_size(node: Node, kind: Kind, size: int, per_gpu: bool = True) -> None:
    """Sizes no container may ask for; `per_gpu`: the share must also fit one GPU (no multi-GPU split known)."""
    res = node.resource_name(kind)
    if size <= 0:
        raise RequestError(f"{res}: allocation size must be positive, got {size}")
    if kind is Kind.CORE and (size % CORE_STEP or (per_gpu and size > CORE_UNITS_PER_GPU)):
        raise RequestError(
            f"{res}: {size} is not a valid compute share; ask for a multiple of {CORE_STEP} from {CORE_STEP} "
            f"to {CORE_UNITS_PER_GPU} (percent of one GPU)", reason="core_share"
        )
    if kind is Kind.COUNT and size > len(node.gpus):
        raise NoRoom(f"{res}: {size} GPUs requested but this node has {len(node.gpus)}")
