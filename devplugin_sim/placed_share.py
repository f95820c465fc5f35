"""Containers placed by the node daemon's own allocator on the one GPU of a simulated core_mem node, each run with
the limits file the daemon wrote for it (gpu_share.Container.limits_file).

Used by tests/shim/test_share_unreserved.py and bench/unreserved_share.py: what a container that asks for gpu-mem
only gets beside one with a compute share is decided by the daemon (its limits file) and held by the shim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from devplugin import contract
from devplugin.allocation.allocator import Allocator
from devplugin.allocation.node import Node
from devplugin.allocation.requests import PodRequest, pod_request
from devplugin.allocation.units import Kind, device_ids
from devplugin.gpu.device import GPU
from devplugin.isolation.shim_delivery import shim_provider
from devplugin.isolation.shim_files import ShimPaths
from devplugin_sim.gpu_share import SHIM, Container

RESOURCES = {Kind.MEM: contract.RESOURCE_MEM, Kind.CORE: contract.RESOURCE_CORE}


class _Pods:
    """The pod cache: the pods bound to the node."""

    def __init__(self) -> None:
        self.items: list[PodRequest] = []

    def pods(self) -> list[PodRequest]:
        return list(self.items)

    def fetch_now(self, budget_s: float) -> list[PodRequest]:
        return self.pods()


def place(state_dir: Path, uuid: str, asks: Sequence[tuple[str, Mapping[Kind, int]]]) -> list[Container]:
    """One container per (name, request), each in its own pod, admitted in order by the daemon's allocator on a
    core_mem node whose one 80 GiB GPU has this UUID (the fake GPU's), the kubelet's way: GetPreferredAllocation
    then Allocate for each resource. Each comes back with the limits file the daemon wrote for it."""
    gpu = GPU(index=0, uuid=uuid, name="NVIDIA H100 80GB HBM3", memory_bytes=80 << 30, minor=0,
              pci_bus_id="00000000:01:00.0", numa_node=0)
    node = Node(gpus=(gpu,), mode="core_mem")
    pods = _Pods()
    allocator = Allocator(node, lookup=pods, mounts=shim_provider(ShimPaths(state_dir, SHIM)))
    held: dict[Kind, set[str]] = {k: set() for k in RESOURCES}
    out = []
    for name, request in asks:
        limits = {f"{node.domain}/{RESOURCES[k]}": str(n) for k, n in request.items()}
        pods.items.append(pod_request({
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"nodeName": "node", "containers": [{"name": "main", "resources": {"limits": limits}}]}}))
        limits_file = ""
        for kind, amount in request.items():
            free = [i for i in device_ids(gpu, kind, node.unit) if i not in held[kind]]
            ids = allocator.preferred(kind, free, [], amount)
            grant = allocator.allocate(kind, ids)
            held[kind].update(ids)
            limits_file = next(m.host_path for m in grant.mounts if m.container_path == contract.CONTAINER_LIMITS_PATH)
        out.append(Container(name, limits_file=limits_file))
    return out


def paid_beside_memory_only(state_dir: Path, uuid: str, share: int, memory_only: int,
                            paid_first: bool = True) -> list[Container]:
    """A container named "paid" with `share` % compute (and 8 GiB) and `memory_only` containers that ask for 4 GiB
    and no compute, the paid one placed first (its neighbours' limits then say what it left unreserved) or last
    (they were placed on a GPU nobody had reserved any of)."""
    paid: list[tuple[str, Mapping[Kind, int]]] = [("paid", {Kind.MEM: 8, Kind.CORE: share})]
    unpaid: list[tuple[str, Mapping[Kind, int]]] = [(f"memonly{i}", {Kind.MEM: 4}) for i in range(memory_only)]
    return place(state_dir, uuid, paid + unpaid if paid_first else unpaid + paid)
