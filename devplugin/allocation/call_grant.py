"""Step 3 of the allocation pipeline: the grant for this call, from the container's decision.

GetPreferredAllocation gets the units of the decision's GPU(s); Allocate gets its IDs checked against the decision
and the node view (it trusts nothing an earlier call said: no device given twice, no whole GPU where slices live),
the envs its own IDs say, and the shim's files for the container. Nothing is committed here (record.py does), so
a call refused at any point leaves the node view as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace

from devplugin.allocation.decision import ContainerKey, Decision
from devplugin.allocation.envs import call_envs, container_envs, shim_envs
from devplugin.allocation.errors import PairingConflict, RequestError
from devplugin.allocation.gpu_picks import RecentShares, pick_units
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.idsets import gpu_label, id_index
from devplugin.allocation.kubelet_reads import handed_on
from devplugin.allocation.node import Node
from devplugin.allocation.paired_decision import Paired
from devplugin.allocation.ports import Grant, Links, MountSpec
from devplugin.allocation.units import Kind, encode_id
from devplugin.allocation.unreserved import cap


@dataclass
class CallGrant:
    node: Node
    holdings: Holdings
    recent: RecentShares
    links: Links

    # ------------------------------------------------------------------ a container the pod cache named
    def preferred(self, dec: Decision, kind: Kind, avail: Mapping[str, set[str]],
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
        return out

    def allocate(self, dec: Decision, kind: Kind, ids: Sequence[str], groups: Mapping[str, set[str]]) -> Grant:
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
        return Grant(dec.gpus, tuple(ids), envs, mounts, dec)

    # ------------------------------------------------------------------ a container placed by node-local pairing
    def paired_preferred(self, paired: Paired, kind: Kind, avail: Mapping[str, set[str]],
                         must: Mapping[str, set[str]], size: int) -> list[str]:
        if kind is Kind.COUNT:
            return [encode_id(u, Kind.COUNT) for u in paired.gpus]
        dec, target = paired.joined, paired.gpus[0]
        free = avail.get(target, set())
        if len(free) < size:
            if dec is not None and kind not in dec.allocated:
                self.recent.add(kind, size)  # a second half that did not fit: the next first half keeps room for it
            other = next(iter(dec.preferred or dec.allocated)).value if dec else "request"
            raise PairingConflict(
                f"{self.node.resource_name(kind)}: this container asks for {size} but "
                f"{gpu_label(self.node, target)}, chosen for its {other}, has only {len(free)} free; a container's "
                "gpu-mem and gpu-core.percentage must fit on one GPU: lower the request or free room on that GPU"
            )
        return pick_units(free, must.get(target, set()), size, key=id_index(self.node, kind).unit.__getitem__)

    def paired_allocate(self, paired: Paired, kind: Kind, ids: Sequence[str],
                        groups: Mapping[str, set[str]]) -> Grant:
        """The grant, on the open decision it joins or on a new one (the decision record.py adopts)."""
        target = paired.joined if paired.joined is not None else Decision(gpus=paired.gpus)
        others = self.holdings.owners(ids) - {target.dir_name}
        self._recheck(target, kind, groups, ids,
                      handed_on(self.links, self.node, kind, ids, others) if others else frozenset())
        trial = Decision(gpus=target.gpus, allocated={**target.allocated, kind: list(ids)}, dir_name=target.dir_name,
                         unreserved=target.unreserved or self._unreserved_cap(kind, paired.gpus))
        envs = container_envs(self.node, kind, paired.gpus, len(ids))
        mounts = self._mounts(trial, kind, ids)
        shim_envs(envs, mounts)
        return Grant(paired.gpus, tuple(ids), envs, mounts, target)

    def _unreserved_cap(self, kind: Kind, uuids: tuple[str, ...]) -> dict[str, int]:
        """The gpu-mem half of a container placed without its pod on a core_mem node: the compute nobody reserved
        on its GPU now, the most it may take if no gpu-core.percentage call follows (its limits say so until one
        does: unreserved.py)."""
        if kind is not Kind.MEM or Kind.CORE not in self.node.kinds:
            return {}
        return {u: cap(self.holdings.free(Kind.CORE, u)) for u in uuids}

    # ------------------------------------------------------------------ both
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
        if self.links.mounts is None or kind is Kind.COUNT:
            return ()
        try:
            return tuple(self.links.mounts(dec, self.node, ids))
        except (OSError, ValueError) as exc:
            raise RequestError(
                f"{self.node.resource_name(kind)}: could not write the isolation files of container "
                f"{dec.label()}: {exc}; check the daemon's --shim-state-dir (free space, permissions)",
                reason="shim_files") from None
