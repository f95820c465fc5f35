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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from devplugin.allocation.decision import ContainerKey
from devplugin.allocation.idsets import id_index
from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind

SHARED_KINDS = (Kind.MEM, Kind.CORE)
RECORD_LAG_S = 0.25  # how long the kubelet may take to show a device it got from us in PodResources
# (it records an Allocate's devices as soon as our answer arrives: milliseconds; a longer grace keeps the
# devices of short-lived pods out of node allocatable, bench/churn.py --mode fallback)


@dataclass
class Holding:
    """What one container holds."""

    holder: str  # the decision's state directory name: unique per container
    key: ContainerKey | None
    ids: dict[Kind, dict[str, frozenset[str]]] = field(default_factory=dict)  # kind -> GPU UUID -> IDs
    since: float = field(default_factory=time.monotonic)  # when it got its last devices

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

    # ------------------------------------------------------------------ changes
    def add(self, holder: str, key: ContainerKey | None, kind: Kind, groups: Mapping[str, Iterable[str]]) -> None:
        """Record that `holder` got these devices of `kind` ({GPU UUID: IDs})."""
        h = self._by_holder.setdefault(holder, Holding(holder, key))
        h.since = time.monotonic()
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
                self._use[kind][uuid].subtract(ids)
                for i in ids:
                    if self._use[kind][uuid][i] <= 0:
                        del self._use[kind][uuid][i]
                    owners = self._owner.get(i)
                    if owners is not None:
                        owners.discard(holder)
                        if not owners:
                            del self._owner[i]
        return h

    def drop_pod(self, pod_uid: str) -> list[Holding]:
        """Forget every container of a pod that ended or was deleted."""
        gone = [h for h in self._by_holder.values() if h.key is not None and h.key.pod_uid == pod_uid]
        return [h for h in (self.drop(g.holder) for g in gone) if h is not None]

    def observe_available(self, kind: Kind, available: Mapping[str, set[str]],
                          must_include: Iterable[str] = ()) -> list[Holding]:
        """The kubelet offers these devices as free: whoever we thought held them has ended (or was rolled back by
        the kubelet). Devices in `must_include` are the kubelet reusing a pod's own devices: not a release."""
        must = set(must_include)
        freed: set[str] = set()
        for uuid, ids in available.items():
            used = self._use[kind].get(uuid)
            if used:
                freed.update(i for i in ids if i in used and i not in must)
        holders = {h for i in freed for h in self._owner.get(i, ())}
        return [h for h in (self.drop(x) for x in sorted(holders)) if h is not None]

    def keep_only(self, held: Mapping[Kind, set[str]], as_of: float | None = None) -> list[Holding]:
        """PodResources says which devices the kubelet has given out: forget holders none of whose devices it
        lists. `as_of` (time.monotonic()) is when that list was asked for: holders that got devices after it (or
        just before: the kubelet records an Allocate only once the plugin answered) are kept."""
        gone = []
        for h in list(self._by_holder.values()):
            if as_of is not None and h.since > as_of - RECORD_LAG_S:
                continue
            mine = [i for kind, per_gpu in h.ids.items() for ids in per_gpu.values() for i in ids
                    if i not in held.get(kind, set())]
            total = sum(len(ids) for per_gpu in h.ids.values() for ids in per_gpu.values())
            if total and len(mine) == total:
                gone.append(h.holder)
        return [h for h in (self.drop(x) for x in gone) if h is not None]

    # ------------------------------------------------------------------ reads
    def holders(self) -> list[Holding]:
        return list(self._by_holder.values())

    def get(self, holder: str) -> Holding | None:
        return self._by_holder.get(holder)

    def owners(self, ids: Iterable[str]) -> set[str]:
        """Holders of any of these devices."""
        return {h for i in ids for h in self._owner.get(i, ())}

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
