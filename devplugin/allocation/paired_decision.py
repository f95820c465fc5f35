"""Step 2 of the allocation pipeline for a container nobody could name (no pod cache, or no answer within the lookup
budget): its decision by node-local pairing. The calls of one container are paired by arrival (pairing_book.py): a call
that is the other half of the open decision joins it and must land on its GPU; a first half is placed by the
node's policy, keeping room for a second half of recent size; gpu-count calls get whole GPUs nobody shares.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devplugin.allocation.decision import Decision
from devplugin.allocation.errors import NoRoom, PairingConflict, RequestError
from devplugin.allocation.gpu_picks import RecentShares, pick_gpu, pick_whole_gpus
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.idsets import gpu_label
from devplugin.allocation.kubelet_reads import kubelet_pods, listed_pods
from devplugin.allocation.node import Node
from devplugin.allocation.pairing_book import PairingBook
from devplugin.allocation.ports import PAIRING_LOG, Links
from devplugin.allocation.units import CORE_STEP, CORE_UNITS_PER_GPU, Kind
from devplugin.allocation.unreserved import MIN_UNRESERVED, advice, reserves_none
from devplugin.allocation.view_sync import with_resync

log = logging.getLogger(PAIRING_LOG)
PARTNER_MINIMUM = {Kind.MEM: 1, Kind.CORE: CORE_STEP}


@dataclass(frozen=True)
class Paired:
    """Where a call of a container placed by node-local pairing goes."""

    gpus: tuple[str, ...]  # the GPU(s) of this call's devices
    joined: Decision | None  # the open decision this call is the other half of; None: a new container
    kubelet_pods: frozenset[tuple[str, str]] | None = None  # placed blind: the pods the kubelet listed then


@dataclass
class PairedDecision:
    node: Node
    holdings: Holdings
    book: PairingBook
    recent: RecentShares
    links: Links

    def for_preferred(self, kind: Kind, avail: dict[str, set[str]], must: dict[str, set[str]],
                      size: int) -> Paired:
        res = self.node.resource_name(kind)
        check_size(self.node, kind, size)
        total = sum(len(v) for v in avail.values())
        if total < size:
            raise NoRoom(f"{res}: {size} requested but only {total} available on this node")
        if kind is Kind.COUNT:
            self.book.current(kind, for_allocate=False)
            return Paired(with_resync(self.links.resync, lambda: self._whole_gpus(avail, must, size)), None)
        if len(must) > 1:
            raise RequestError(f"{res}: must-include IDs span {len(must)} GPUs; one container's share is on one GPU")
        dec = self._joined(self.book.current(kind, for_allocate=False), kind, preferring=True)
        pods = None
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
            pods = kubelet_pods(self.links)
            if pods is None and self.links.refresh is not None:
                self.links.refresh()
            target = with_resync(self.links.resync, lambda: self._place(kind, avail, size))
        return Paired((target,), dec, pods)

    def for_allocate(self, kind: Kind, ids: Sequence[str], groups: dict[str, set[str]]) -> Paired:
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
            check_size(self.node, kind, len(ids))
        dec = self._joined(self.book.current(kind, for_allocate=True), kind)
        if dec is not None and dec.gpus != uuids:
            have = next(iter(dec.allocated or dec.preferred))
            raise PairingConflict(
                f"{res}: this container's {have.value} is on {gpu_label(self.node, dec.gpus[0])} but its "
                f"{kind.value} devices are on {gpu_label(self.node, uuids[0])}; both must share one GPU "
                "(retry the pod; if it keeps failing, the GPU it was scheduled for lacks room)"
            )
        return Paired(uuids, dec)

    def _place(self, kind: Kind, avail: dict[str, set[str]], size: int) -> str:
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
        healthy = self.links.healthy
        room = {uuid: len(units) for uuid, units in avail.items()
                if not self.holdings.whole(uuid) and healthy(uuid) and len(units) >= size
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
        roomy = [u for u, units in avail.items() if not self.holdings.whole(u) and self.links.healthy(u)
                 and len(units) >= size]
        if not roomy or any(self.holdings.free(Kind.CORE, u) >= MIN_UNRESERVED for u in roomy):
            return None
        detail = ", ".join(f"GPU {self.node.by_uuid[u].index}: {self.holdings.free(Kind.CORE, u)} % core free"
                           for u in roomy)
        return NoRoom(f"{self.node.resource_name(kind)}: the GPUs with {size} free units have no compute nobody "
                      f"reserved ({detail}): {advice(self.node.resource_name(Kind.CORE))}",
                      reason="no_unreserved_compute")

    def _whole_gpus(self, avail: Mapping[str, set[str]], must: Mapping[str, set[str]],
                    size: int) -> tuple[str, ...]:
        res = self.node.resource_name(Kind.COUNT)
        candidates = [u for u in avail if not self.holdings.shared(u) and self.links.healthy(u)]
        busy = [u for u in must if u not in candidates]
        if busy:
            raise PairingConflict(f"{res}: {gpu_label(self.node, busy[0])} is shared by other containers")
        chosen = pick_whole_gpus(self.node, candidates, list(must), size)
        if chosen is None:
            raise NoRoom(
                f"{res}: {size} whole GPU(s) requested but only {len(candidates)} have no shared containers "
                f"(of {len(avail)} not given whole); wait for shared pods to end or ask for fewer"
            )
        return tuple(chosen)

    def _joined(self, dec: Decision | None, kind: Kind, preferring: bool = False) -> Decision | None:
        """`dec` if this call of `kind` is its container's other resource, as far as the kubelet's PodResources can
        tell; None when it is the next container's first. The kubelet puts a pod in its pod manager (which
        PodResources lists) just before admitting it, one pod at a time: a pod listed now that was not when the
        decision opened means the decision's pod was done (whether the kubelet admitted it or rejected it by itself
        for too few devices of its other resource). Whether the first half's devices are listed says nothing: the
        kubelet does not list init containers. `preferring`: the call is GetPreferredAllocation, which takes its
        units from the kubelet's own `available` (kubelet_reads.listed_pods)."""
        if dec is None or kind in dec.allocated or kind in dec.preferred or not dec.allocated:
            return dec
        if dec.kubelet_pods is None:
            return dec  # the kubelet could not be asked when it opened: pair by arrival
        listed = listed_pods(self.links, self.holdings) if preferring else kubelet_pods(self.links)
        if listed is None or listed <= dec.kubelet_pods:
            return dec
        later = sorted(listed - dec.kubelet_pods)[0]
        why = f"the kubelet has moved on to pod {later[0]}/{later[1]}"
        log.info("%s: a new container, not the other half of the last one: %s", self.node.resource_name(kind), why,
                 extra={"fields": {"resource": self.node.resource_name(kind), "state_dir": dec.dir_name}})
        self.book.close()
        return None


def check_size(node: Node, kind: Kind, size: int, per_gpu: bool = True) -> None:
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
