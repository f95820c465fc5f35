"""One view of the node: which devices each container holds, per resource and GPU.

Every Allocate adds to it; it forgets a container when the kubelet says its devices are free again (they come
back in a call's `available`), when the pod cache says its pod ended, or when the kubelet's PodResources no
longer lists its devices. Free room per GPU is derived from it for every resource at once, so a gpu-count
container that ended frees its GPU for gpu-mem calls too, whichever resource the kubelet calls next. Devices
that two containers of one pod share (the kubelet reuses an init container's devices for an app container) are
counted once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from devplugin.allocation.decision import ContainerKey
from devplugin.allocation.idsets import id_index
from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind

SHARED_KINDS = (Kind.MEM, Kind.CORE)
RECORD_LAG_S = 0.1  # how long the kubelet may take to show a device it got from us in PodResources
# (it records an Allocate's devices as soon as our answer arrives: milliseconds; a longer grace keeps the
# devices of short-lived pods out of node allocatable, bench/churn.py --mode fallback). A holder PodResources has
# listed once needs no grace: not listed any more, it has ended. A known container whose pod the kubelet still
# lists needs none either: it is kept until its devices are listed (keep_only).


@dataclass
class Holding:
    """What one container holds."""

    holder: str  # the decision's state directory name: unique per container
    key: ContainerKey | None
    ids: dict[Kind, dict[str, frozenset[str]]] = field(default_factory=dict)  # kind -> GPU UUID -> IDs
    since: float = field(default_factory=time.monotonic)  # when it got its last devices
    listed: bool = False  # PodResources has listed its devices since then
    exact: bool = True  # key is the container's own (False: the likeliest of several; PodResources corrects it)

    def gpus(self) -> set[str]:
        return {uuid for per_gpu in self.ids.values() for uuid in per_gpu}


class Holdings:
    """Held devices by container, with per-(resource, GPU) use counted incrementally."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._by_holder: dict[str, Holding] = {}
        self._use: dict[Kind, dict[str, Counter[str]]] = {
            kind: {g.uuid: Counter() for g in node.gpus} for kind in Kind
        }
        self._owner: dict[str, set[str]] = {}  # device ID -> holders
        self._on_gpu: dict[str, set[str]] = {g.uuid: set() for g in node.gpus}  # GPU UUID -> holders
        # The last keep_only kept devices the kubelet did not list (got just before the list was asked for, or a
        # known container whose pod is listed): a list a moment later may forget them.
        self.unsettled = False

    # ------------------------------------------------------------------ changes
    def add(self, holder: str, key: ContainerKey | None, kind: Kind, groups: Mapping[str, Iterable[str]],
            exact: bool = True) -> None:
        """Record that `holder` got these devices of `kind` ({GPU UUID: IDs})."""
        h = self._by_holder.setdefault(holder, Holding(holder, key, exact=exact))
        if key is not None:
            h.key, h.exact = key, exact
        h.since = time.monotonic()
        h.listed = False
        per_gpu = h.ids.setdefault(kind, {})
        for uuid, ids in groups.items():
            new = frozenset(ids) - per_gpu.get(uuid, frozenset())
            per_gpu[uuid] = per_gpu.get(uuid, frozenset()) | new
            self._use[kind][uuid].update(new)
            self._on_gpu[uuid].add(holder)
            for i in new:
                self._owner.setdefault(i, set()).add(holder)

    def drop(self, holder: str) -> Holding | None:
        h = self._by_holder.pop(holder, None)
        if h is None:
            return None
        for kind, per_gpu in h.ids.items():
            for uuid, ids in per_gpu.items():
                self._on_gpu[uuid].discard(holder)
                self._uncount(holder, kind, uuid, ids)
        return h

    def _uncount(self, holder: str, kind: Kind, uuid: str, ids: Iterable[str]) -> None:
        """These devices are no longer `holder`'s (a device two holders share stays counted once for the other)."""
        use = self._use[kind][uuid]
        for i in ids:
            use[i] -= 1
            if use[i] <= 0:
                del use[i]
            owners = self._owner.get(i)
            if owners is not None:
                owners.discard(holder)
                if not owners:
                    del self._owner[i]

    def release(self, holder: str, kind: Kind, ids: Iterable[str]) -> Holding | None:
        """Take some devices of `kind` from a holder (dropping it when nothing is left); the holder, if it was
        dropped."""
        h = self._by_holder.get(holder)
        if h is None:
            return None
        gone = set(ids)
        per_gpu = h.ids.get(kind, {})
        for uuid in list(per_gpu):
            mine = per_gpu[uuid] & gone
            if not mine:
                continue
            per_gpu[uuid] = per_gpu[uuid] - mine
            self._uncount(holder, kind, uuid, mine)
            if not per_gpu[uuid]:
                del per_gpu[uuid]
                if all(uuid not in g for g in h.ids.values()):
                    self._on_gpu[uuid].discard(holder)
        if not per_gpu:
            h.ids.pop(kind, None)
        if not h.ids:
            return self.drop(holder)
        return None

    def drop_pod(self, pod_uid: str) -> list[Holding]:
        """Forget every container of a pod that ended or was deleted."""
        gone = [h for h in self._by_holder.values() if h.key is not None and h.key.pod_uid == pod_uid]
        return [h for h in (self.drop(g.holder) for g in gone) if h is not None]

    def observe_available(self, kind: Kind, available: Mapping[str, set[str]],
                          must_include: Iterable[str] = ()) -> list[Holding]:
        """The kubelet offers these devices as free: whoever we thought held them has ended (or was rolled back by
        the kubelet). Devices in `must_include` are the kubelet reusing a pod's own devices: not a release."""
        freed: set[str] = set()
        for uuid, ids in available.items():
            used = self._use[kind].get(uuid)
            if used:
                freed |= ids & used.keys()  # set operations: this runs on every call, over hundreds of IDs
        if freed and must_include:
            freed -= set(must_include)
        holders = {h for i in freed for h in self._owner.get(i, ())}
        dropped = []
        for x in sorted(holders):
            h = self._by_holder[x]
            if h.key is not None:  # one known container: all of it has ended (or was rolled back)
                dropped.append(self.drop(x))
            else:  # placed without its pod, it may hold parts of two containers (pairing): free only what is seen
                dropped.append(self.release(x, kind, freed))
        return [h for h in dropped if h is not None]

    def keep_only(self, held: Mapping[Kind, set[str]], as_of: float | None = None,
                  pods: Collection[tuple[str, str]] | None = None) -> list[Holding]:
        """PodResources says which devices the kubelet has given out: forget holders none of whose devices it
        lists. `as_of` (time.monotonic()) is when that list was asked for: holders that got devices after it (or
        just before: the kubelet records an Allocate only once the plugin answered) are kept. `pods`: the pods
        (namespace, name) the same list names; a known container never listed yet whose pod the kubelet still
        lists is kept however long its answer takes to be recorded (a loaded kubelet): its pod has not ended."""
        gone = []
        unsettled = False
        for h in list(self._by_holder.values()):
            unlisted = {kind: set().union(*per_gpu.values()).difference(held.get(kind, ()))
                        for kind, per_gpu in h.ids.items()}
            total = sum(len(ids) for per_gpu in h.ids.values() for ids in per_gpu.values())
            missing = sum(len(v) for v in unlisted.values())
            fresh = as_of is not None and h.since > as_of - RECORD_LAG_S  # the kubelet may not show it yet
            if total and missing == total:
                waiting = pods is not None and h.key is not None and (h.key.namespace, h.key.pod) in pods
                if h.listed or not (fresh or waiting):  # listed before and not now, or never and it ended
                    gone.append(h.holder)
                else:
                    unsettled = True
                continue
            h.listed = True
            if missing and h.key is None and not fresh:
                # placed without its pod, it may hold parts of two containers (pairing): one of them ended
                for kind, ids in unlisted.items():
                    if ids:
                        self.release(h.holder, kind, ids)
            elif missing:
                unsettled = True
        self.unsettled = unsettled
        return [h for h in (self.drop(x) for x in gone) if h is not None]

    # ------------------------------------------------------------------ reads
    def holders(self) -> list[Holding]:
        return list(self._by_holder.values())

    def get(self, holder: str) -> Holding | None:
        return self._by_holder.get(holder)

    def owners(self, ids: Iterable[str]) -> set[str]:
        """Holders of any of these devices."""
        get = self._owner.get  # on every PodResources sync, for every device listed: kept to set operations
        return set().union(*[get(i, ()) for i in ids])

    def used(self, kind: Kind, uuid: str) -> int:
        return len(self._use[kind][uuid])

    def free(self, kind: Kind, uuid: str) -> int:
        return self._node.units(uuid, kind) - self.used(kind, uuid)

    def free_ids(self, kind: Kind, uuid: str) -> set[str]:
        """Every device of `kind` on this GPU that no container holds (for calls that carry no `available`)."""
        mine = dict(id_index(self._node, kind).per_gpu)[uuid]
        return set(mine - self._use[kind][uuid].keys())

    def whole(self, uuid: str) -> bool:
        """The GPU is held whole by a gpu-count container."""
        return self.used(Kind.COUNT, uuid) > 0

    def shared(self, uuid: str) -> bool:
        """Some container holds gpu-mem or gpu-core.percentage units of this GPU."""
        return any(self.used(k, uuid) for k in SHARED_KINDS)

    def containers_on(self, uuid: str) -> int:
        return len(self._on_gpu[uuid])
