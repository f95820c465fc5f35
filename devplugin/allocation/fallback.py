"""Node-local pairing, the fallback when the pod cache cannot name the container (no apiserver, or not within the
lookup budget): the calls of one container are paired by arrival (pairing.py), its first resource placed with room
kept for a second of recent size. Part of Allocator (allocator.py), which holds the state it works on."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, TypeVar

from devplugin.allocation.decision import Decision
from devplugin.allocation.envs import container_envs, shim_envs
from devplugin.allocation.errors import NoRoom, PairingConflict, RequestError
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.idsets import gpu_label, id_index
from devplugin.allocation.node import Node
from devplugin.allocation.pairing import PairingBook
from devplugin.allocation.placement import RecentShares, pick_gpu, pick_units, pick_whole_gpus
from devplugin.allocation.ports import Grant, KubeletListing, MountSpec, PodLookup, Reporter
from devplugin.allocation.units import CORE_STEP, CORE_UNITS_PER_GPU, Kind, encode_id
from devplugin.allocation.unreserved import MIN_UNRESERVED, advice, cap, reserves_none

T = TypeVar("T")
log = logging.getLogger(__name__)
PARTNER_MINIMUM = {Kind.MEM: 1, Kind.CORE: CORE_STEP}


class PairingFallback:
    """The node-local pairing half of Allocator."""

    node: Node
    holdings: Holdings
    book: PairingBook
    recent: RecentShares
    reporter: Reporter
    healthy: Callable[[str], bool]
    refresh: Callable[[], object] | None
    read_kubelet: Callable[[], KubeletListing | None] | None
    read_pods: Callable[[], frozenset[tuple[str, str]] | None] | None
    on_guess: Callable[[], object]
    lookup: PodLookup | None
    _lock: threading.RLock

    if TYPE_CHECKING:  # Allocator's own, shared with the pod-identity path
        def _with_resync(self, attempt: Callable[[], T]) -> T:
            raise NotImplementedError

        def _recheck(self, dec: Decision, kind: Kind, groups: Mapping[str, set[str]], ids: Sequence[str],
                     reused: Set[str] = frozenset()) -> None:
            raise NotImplementedError

        def _mounts(self, dec: Decision, kind: Kind, ids: Sequence[str]) -> tuple[MountSpec, ...]:
            raise NotImplementedError

        def _log_grant(self, dec: Decision, kind: Kind, ids: Sequence[str]) -> None:
            raise NotImplementedError

    def _anonymous_preferred(self, kind: Kind, avail: dict[str, set[str]], must: dict[str, set[str]],
                             size: int) -> list[str]:
        if kind is Kind.COUNT:
            self.book.current(kind, for_allocate=False)
            return self._with_resync(lambda: self._preferred_whole(avail, must, size))
        res = self.node.resource_name(kind)
        if len(must) > 1:
            raise RequestError(f"{res}: must-include IDs span {len(must)} GPUs; one container's share is on one GPU")
        dec = self._joined(self.book.current(kind, for_allocate=False), kind, preferring=True)
        kubelet_pods = None
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
            # placed blind: at least see the other resource as the kubelet does now (one local call)
            kubelet_pods = self._kubelet_pods()
            if kubelet_pods is None and self.refresh is not None:
                self.refresh()
            target = self._with_resync(lambda: self._place_anonymous(kind, avail, size))
        free = avail.get(target, set())
        if len(free) < size:
            if dec is not None and kind not in dec.allocated:
                self.recent.add(kind, size)  # a second half that did not fit: the next first half keeps room for it
            other = next(iter(dec.preferred or dec.allocated)).value if dec else "request"
            raise PairingConflict(
                f"{res}: this container asks for {size} but {gpu_label(self.node, target)}, chosen for its "
                f"{other}, has only {len(free)} free; a container's gpu-mem and gpu-core.percentage must fit "
                "on one GPU: lower the request or free room on that GPU"
            )
        ids = pick_units(free, must.get(target, set()), size, key=id_index(self.node, kind).unit.__getitem__)
        if dec is None:
            dec = self.book.open((target,))
            dec.kubelet_pods = kubelet_pods if not must else self._kubelet_pods()
        dec.preferred[kind] = ids
        return ids

    def _place_anonymous(self, kind: Kind, avail: dict[str, set[str]], size: int) -> str:
        """Choose a GPU for a new container by the node's policy, leaving out GPUs it could not use.

        The other half of the container comes later, its size unknown: among the GPUs with room for this half, only
        those whose room for the other half would hold the most of what recent containers asked (replicas of one
        workload ask alike) are considered, then the node's policy picks. When no GPU holds every recent size, this
        takes the GPU with the most room for the other half: if the container cannot fit there, it fits nowhere."""
        partner = Kind.CORE if kind is Kind.MEM else Kind.MEM
        pair = partner in self.node.kinds and Kind.CORE in self.node.kinds
        # on a core_mem node every container needs some compute nobody reserved on its GPU: its own share, or, if
        # it asks for memory only, some to run on (unreserved.py); either way a GPU without any is no choice
        unreserved = MIN_UNRESERVED if kind is Kind.MEM and reserves_none(self.node.mode, size, 0) else 0
        room = {uuid: len(units) for uuid, units in avail.items()
                if not self.holdings.whole(uuid) and self.healthy(uuid) and len(units) >= size
                and self.holdings.free(Kind.CORE, uuid) >= unreserved}
        if pair and room:
            covered = {uuid: self.recent.covered(partner, self.holdings.free(partner, uuid)) for uuid in room}
            best = max(covered.values())
            room = {uuid: free for uuid, free in room.items() if covered[uuid] == best}
        target = pick_gpu(self.node, room, size, self.node.placement)
        if target is None and (no_compute := self._no_unreserved(kind, avail, size)) is not None:
            raise no_compute
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

    def _no_unreserved(self, kind: Kind, avail: dict[str, set[str]], size: int) -> NoRoom | None:
        """NoRoom when GPUs have the memory but none has compute nobody reserved (None otherwise)."""
        if kind is not Kind.MEM or not reserves_none(self.node.mode, size, 0):
            return None
        roomy = [u for u, units in avail.items() if not self.holdings.whole(u) and self.healthy(u)
                 and len(units) >= size]
        if not roomy or any(self.holdings.free(Kind.CORE, u) >= MIN_UNRESERVED for u in roomy):
            return None
        detail = ", ".join(f"GPU {self.node.by_uuid[u].index}: {self.holdings.free(Kind.CORE, u)} % core free"
                           for u in roomy)
        return NoRoom(f"{self.node.resource_name(kind)}: the GPUs with {size} free units have no compute nobody "
                      f"reserved ({detail}): {advice(self.node.resource_name(Kind.CORE))}",
                      reason="no_unreserved_compute")

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
        dec = self._joined(self.book.current(kind, for_allocate=True), kind)
        if dec is not None and dec.gpus != uuids:
            have = next(iter(dec.allocated or dec.preferred))
            raise PairingConflict(
                f"{res}: this container's {have.value} is on {gpu_label(self.node, dec.gpus[0])} but its "
                f"{kind.value} devices are on {gpu_label(self.node, uuids[0])}; both must share one GPU "
                "(retry the pod; if it keeps failing, the GPU it was scheduled for lacks room)"
            )
        target = dec if dec is not None else Decision(gpus=uuids)
        others = self.holdings.owners(ids) - {target.dir_name}
        self._recheck(target, kind, groups, ids, self._handed_on(kind, ids, others) if others else frozenset())
        trial = Decision(gpus=target.gpus, allocated={**target.allocated, kind: list(ids)}, dir_name=target.dir_name,
                         unreserved=target.unreserved or self._unreserved_cap(kind, uuids))
        envs = container_envs(self.node, kind, uuids, len(ids))
        mounts = self._mounts(trial, kind, ids)
        shim_envs(envs, mounts)
        if dec is None:
            dec = self.book.adopt(target)
            dec.kubelet_pods = self._kubelet_pods()
        self.holdings.add(dec.dir_name, None, kind, groups)
        held = self.holdings.get(dec.dir_name)
        if self.lookup is not None or (held is not None and held.key is not None):
            # placed without its pod's name (the lookup did not answer in time), or named from PodResources and the
            # pod cache between its resources (ViewSync.reconcile) and recorded only once it holds them all: a sync
            # in a moment names it and records it on its pod
            self.on_guess()
        self.book.allocated(dec, kind, list(ids))
        if kind is not Kind.COUNT:
            self.recent.add(kind, len(ids))
        self.reporter.occupancy_changed(self.holdings)
        self._log_grant(dec, kind, ids)
        return Grant(uuids, tuple(ids), envs, mounts, dec)


    def _unreserved_cap(self, kind: Kind, uuids: tuple[str, ...]) -> dict[str, int]:
        """The gpu-mem half of a container placed without its pod on a core_mem node: the compute nobody reserved
        on its GPU now, the most it may take if no gpu-core.percentage call follows (its limits say so until one
        does: unreserved.py)."""
        if kind is not Kind.MEM or Kind.CORE not in self.node.kinds:
            return {}
        return {u: cap(self.holdings.free(Kind.CORE, u)) for u in uuids}

    def _joined(self, dec: Decision | None, kind: Kind, preferring: bool = False) -> Decision | None:
        """`dec` if this call of `kind` is its container's other resource, as far as the kubelet's PodResources can
        tell; None when it is the next container's first. The kubelet puts a pod in its pod manager (which
        PodResources lists) just before admitting it, one pod at a time: a pod listed now that was not when the
        decision opened means the decision's pod was done (whether the kubelet admitted it or rejected it by itself
        for too few devices of its other resource). Whether the first half's devices are listed says nothing: the
        kubelet does not list init containers. `preferring`: the call is GetPreferredAllocation, which takes its
        units from the kubelet's own `available` (_listed_pods)."""
        if dec is None or kind in dec.allocated or kind in dec.preferred or not dec.allocated:
            return dec
        if dec.kubelet_pods is None:
            return dec  # the kubelet could not be asked when it opened: pair by arrival
        listed = self._listed_pods() if preferring else self._kubelet_pods()
        if listed is None or listed <= dec.kubelet_pods:
            return dec
        later = sorted(listed - dec.kubelet_pods)[0]
        why = f"the kubelet has moved on to pod {later[0]}/{later[1]}"
        if not why:
            return dec
        log.info("%s: a new container, not the other half of the last one: %s", self.node.resource_name(kind), why,
                 extra={"fields": {"resource": self.node.resource_name(kind), "state_dir": dec.dir_name}})
        self.book.close()
        return None

    def _listed_pods(self) -> frozenset[tuple[str, str]] | None:
        """The pods the kubelet lists now (None when it cannot be asked), for the GetPreferredAllocation of a
        container's second resource. Without a pod cache that is all it needs: its GPU was chosen on its first call,
        right after a sync; its units come from the kubelet's `available`, which frees the stale holders of this
        resource (Allocator._observe); a sync now could name no container (no pods to name them from) and would
        only forget ended holders a moment before the next container's first call does, before that places
        anything. It still syncs when the last sync kept devices the kubelet did not list (Holdings.unsettled: a
        container that ended just after its Allocate), which a sync a moment later may forget; and with a pod
        cache, where the kubelet lists the first resource's devices by now and the sync names the container from
        them (ViewSync.reconcile)."""
        if self.lookup is None and self.read_pods is not None and not self.holdings.unsettled:
            return self.read_pods()
        return self._kubelet_pods()

    def _kubelet_pods(self) -> frozenset[tuple[str, str]] | None:
        """The pods the kubelet lists now, the node view synced with it (None when it cannot be asked)."""
        if self.read_kubelet is None:
            return None
        listing = self.read_kubelet()
        return listing.pods if listing is not None else None

    def _handed_on(self, kind: Kind, ids: Sequence[str], holders: Set[str]) -> Set[str]:
        """`holders` when the kubelet hands their devices on to this container: no live container the kubelet lists
        holds them (an init container's devices, which the kubelet reuses for the pod's app containers without
        asking the plugin: PodResources does not list init containers), else nothing (a device given twice)."""
        listing = self.read_kubelet() if self.read_kubelet is not None else None
        if listing is None:
            return frozenset()
        wanted = set(ids)
        if any(wanted.intersection(entry.devices.get(kind, ())) for entry in listing.containers):
            return frozenset()
        log.info("%s: the kubelet hands devices of an earlier container on to this one (an init container's, "
                 "reused by an app container of its pod)", self.node.resource_name(kind),
                 extra={"fields": {"resource": self.node.resource_name(kind), "devices": len(ids),
                                   "holders": ",".join(sorted(holders))}})
        return holders


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
