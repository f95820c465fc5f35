"""GetPreferredAllocation and Allocate as plain functions of the node, the kubelet's view and the open decision.

The gRPC servicers are thin wrappers over `Allocator.preferred` and `Allocator.allocate`; tests call these
directly. All state changes happen under one lock (the kubelet serialises admissions anyway).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from devplugin.allocation.envs import container_envs
from devplugin.allocation.errors import NoRoom, PairingConflict, RequestError
from devplugin.allocation.idsets import gpu_label, group_ids, id_index
from devplugin.allocation.ledger import Ledger
from devplugin.allocation.node import Node
from devplugin.allocation.pairing import Decision, PairingBook
from devplugin.allocation.placement import RecentShares, pick_gpu, pick_units, pick_whole_gpus
from devplugin.allocation.units import CORE_STEP, CORE_UNITS_PER_GPU, Kind, encode_id

log = logging.getLogger(__name__)

PARTNER_MINIMUM = {Kind.MEM: 1, Kind.CORE: CORE_STEP}


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


# Called on each shared Allocate with (decision, node) -> mounts; the shim delivery plugs in here.
MountProvider = Callable[[Decision, Node], Sequence[MountSpec]]


@dataclass
class Allocator:
    node: Node
    pair_window_s: float = 1.0
    mounts: MountProvider | None = None
    ledger: Ledger = field(init=False)
    book: PairingBook = field(init=False)

    def __post_init__(self) -> None:
        self.recent = RecentShares(PARTNER_MINIMUM)
        self.ledger = Ledger(self.node)
        self.book = PairingBook(self.pair_window_s)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ GetPreferredAllocation
    def preferred(self, kind: Kind, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The device IDs this container should get: `size` of `available`, including `must_include`."""
        try:
            return self._preferred(kind, available, must_include, size)
        except RequestError:
            self._refused()
            raise

    def _refused(self) -> None:
        """A refused call makes the kubelet reject the pod: its open decision must not catch the next one."""
        with self._lock:
            self.book.close()

    def _preferred(self, kind: Kind, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        res = self.node.resource_name(kind)
        _check_size(self.node, kind, size)
        avail = group_ids(self.node, kind, available, "available IDs")
        must = group_ids(self.node, kind, must_include, "must-include IDs")
        for uuid, ids in must.items():
            missing = ids - avail.get(uuid, set())
            if missing:
                raise RequestError(f"{res}: must-include IDs are not among the available IDs ({len(missing)} missing)")
        total = sum(len(v) for v in avail.values())
        if total < size:
            raise NoRoom(f"{res}: {size} requested but only {total} available on this node")
        with self._lock:
            self.book.forget_rolled_back(kind, avail)
            self.ledger.observe_available(kind, avail)
            if kind is Kind.COUNT:
                self.book.current(kind, for_allocate=False)
                return self._preferred_whole(avail, must, size)
            return self._preferred_share(kind, avail, must, size)

    def _preferred_share(self, kind: Kind, avail: dict[str, set[str]], must: dict[str, set[str]],
                         size: int) -> list[str]:
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
            target = self._place(kind, avail, size)
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

    def _place(self, kind: Kind, avail: dict[str, set[str]], size: int) -> str:
        """Choose a GPU for a new container by the node's policy, leaving out GPUs it could not use."""
        partner = Kind.CORE if kind is Kind.MEM else Kind.MEM
        pair = partner in self.node.kinds and Kind.CORE in self.node.kinds
        usable = {uuid: len(units) for uuid, units in avail.items() if not self.ledger.held_whole(uuid)}
        target = None
        # The other half of the container comes later, its size unknown: first keep room for what recent
        # containers asked (replicas of one workload ask alike), then settle for the smallest possible share.
        for reserve in ((self.recent.reserve(partner), PARTNER_MINIMUM[partner]) if pair else (0,)):
            room = {u: free for u, free in usable.items() if self.ledger.free(partner, u) >= reserve}
            target = pick_gpu(self.node, room, size, self.node.placement)
            if target is not None:
                break
        if target is None:
            detail = ", ".join(
                f"GPU {self.node.by_uuid[u].index}: {len(avail.get(u, []))}"
                + (" (held whole)" if self.ledger.held_whole(u) else "")
                for u in self.node.by_uuid
            )
            raise NoRoom(
                f"{self.node.resource_name(kind)}: no single GPU has {size} free units ({detail}); a container's "
                "share must fit on one GPU: lower the request or wait for room"
            )
        return target

    def _preferred_whole(self, avail: dict[str, set[str]], must: dict[str, set[str]], size: int) -> list[str]:
        res = self.node.resource_name(Kind.COUNT)
        candidates = [u for u in avail if self.ledger.untouched(u)]
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

    # ------------------------------------------------------------------ Allocate
    def allocate(self, kind: Kind, ids: Sequence[str]) -> Grant:
        """Validate one container's IDs of `kind` and say what the container gets."""
        try:
            return self._allocate(kind, ids)
        except RequestError:
            self._refused()
            raise

    def _allocate(self, kind: Kind, ids: Sequence[str]) -> Grant:
        res = self.node.resource_name(kind)
        if not ids:
            raise RequestError(f"{res}: Allocate carried no device IDs")
        groups = group_ids(self.node, kind, ids, "Allocate IDs")
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
            if kind is Kind.CORE:
                _check_size(self.node, kind, len(ids))
        with self._lock:
            dec = self.book.current(kind, for_allocate=True)
            if dec is not None and dec.gpus != uuids:
                have = next(iter(dec.allocated or dec.preferred))
                raise PairingConflict(
                    f"{res}: this container's {have.value} is on {gpu_label(self.node, dec.gpus[0])} but its "
                    f"{kind.value} devices are on {gpu_label(self.node, uuids[0])}; both must share one GPU "
                    "(retry the pod; if it keeps failing, the GPU it was scheduled for lacks room)"
                )
            if dec is None:
                dec = self.book.open(uuids)
            for uuid, units in groups.items():
                self.ledger.take(kind, uuid, units)
            self.book.allocated(dec, kind, list(ids))
            if kind is not Kind.COUNT:
                self.recent.add(kind, len(ids))
            envs = container_envs(self.node, kind, uuids, len(ids))
            mounts = tuple(self.mounts(dec, self.node)) if self.mounts and kind is not Kind.COUNT else ()
            grant = Grant(uuids, tuple(ids), envs, mounts)
        log.info(
            "allocated %d %s on GPU %s", len(ids), res, envs.get("ALIYUN_COM_GPU_MEM_IDX"),
            extra={"fields": {"resource": res, "gpu": ",".join(uuids), "devices": len(ids),
                              "alloc_id": dec.alloc_id}},
        )
        return grant

    def mark_allocated(self, kind: Kind, ids: Sequence[str]) -> None:
        """Tell the view about devices already held (PodResources after a restart); unknown IDs are skipped."""
        known = id_index(self.node, kind).every
        strangers = [i for i in ids if i not in known]
        if strangers:
            log.warning("ignoring %d held %s devices this node does not advertise, e.g. %r", len(strangers),
                        self.node.resource_name(kind), strangers[0])
        groups = group_ids(self.node, kind, [i for i in dict.fromkeys(ids) if i in known], "held IDs")
        with self._lock:
            self.ledger.mark_allocated(kind, groups)


def _check_size(node: Node, kind: Kind, size: int) -> None:
    res = node.resource_name(kind)
    if size <= 0:
        raise RequestError(f"{res}: allocation size must be positive, got {size}")
    if kind is Kind.CORE and (size % CORE_STEP or size > CORE_UNITS_PER_GPU):
        raise RequestError(
            f"{res}: {size} is not a valid compute share; ask for a multiple of {CORE_STEP} from {CORE_STEP} "
            f"to {CORE_UNITS_PER_GPU} (percent of one GPU)"
        )
    if kind is Kind.COUNT and size > len(node.gpus):
        raise NoRoom(f"{res}: {size} GPUs requested but this node has {len(node.gpus)}")
