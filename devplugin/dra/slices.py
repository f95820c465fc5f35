"""This node's ResourceSlices (resource.k8s.io/v1) from its GPUs: pure, no I/O.

One pool per node (named after the node) in two slices, as the API wants counters and devices apart:
- `<node>-gpushare-counters`: one shared counter set `gpus` with a counter `gpu-N: 1` per GPU (the API allows 8
  counter sets per slice but 32 counters per set: one set serves 32 GPUs, what 64 devices per slice allow);
- `<node>-gpushare-devices`: per GPU a shared device `gpu-N` (type=share, allowMultipleAllocations, consumable
  `memory` and `cores`) and an exclusive device `gpu-N-whole` (type=whole). Both consume `gpu-N: 1` from `gpus`, so
  the scheduler gives a GPU either to shares or to one whole claim, never both: a device that allows multiple
  allocations takes its counters with its first share and gives them back with its last.
A MIG device (gpu/mig.py) is published as a GPU of its own, `gpu-N` and `gpu-N-whole` at its share index, with its
memory, and the attributes `migProfile`, `parentUUID` and `parentIndex`; its GPU is not published.
Where known, each device carries `nvlinkIsland` (GPUs joined by NVLink share it: a claim's `matchAttribute` on it
keeps the claim's GPUs on one island) and `numaNode`.
A GPU the health watcher failed carries the NoSchedule taint `gpu.gpushare.io/unhealthy` on both its devices.
The names are the first-tried ones (devplugin/dra/slice_names.py); the publisher gives a slice another name of the
node's own when that one is taken.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from devplugin import contract
from devplugin.dra.capacity import GpuCapacity, cores_policy, memory_offered, memory_policy
from devplugin.dra.slice_names import slice_names
from devplugin.gpu.device import GPU
from devplugin.gpu.facts import GpuFacts

API_VERSION = "resource.k8s.io/v1"
COUNTER_SET = "gpus"
MAX_GPUS = 32  # counters per counter set, and 64 devices per slice (two per GPU)
SLICE_COUNT = 2
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_TAINT_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class DeviceRef:
    """A published device: which GPU, shared or whole."""

    gpu: GPU
    whole: bool
    offered: GpuCapacity


def share_name(gpu: GPU) -> str:
    return f"gpu-{gpu.index}"


def whole_name(gpu: GPU) -> str:
    return f"gpu-{gpu.index}-whole"


def counter_name(gpu: GPU) -> str:
    return f"gpu-{gpu.index}"


def devices_by_name(gpus: Sequence[GPU]) -> dict[str, DeviceRef]:
    """Every device this node publishes, by device name (what an allocation result names)."""
    out: dict[str, DeviceRef] = {}
    for gpu in gpus:
        offered = GpuCapacity(memory=memory_offered(gpu.memory_bytes))
        out[share_name(gpu)] = DeviceRef(gpu, False, offered)
        out[whole_name(gpu)] = DeviceRef(gpu, True, offered)
    return out


def semver(text: str) -> str:
    """A DRA `version` attribute must be semantic: "8.0" -> "8.0.0", "550.54.15" stays; "" when it is not one."""
    m = _VERSION.match(text or "")
    if not m:
        return ""
    return f"{int(m.group(1))}.{int(m.group(2))}.{int(m.group(3) or 0)}"


def taint_value(reason: str) -> str:
    """A label-like value from the health watcher's reason: "xid-48" for an XID, else a cleaned short reason."""
    m = re.search(r"XID (\d+)", reason, re.IGNORECASE)
    if m:
        return f"xid-{m.group(1)}"
    cleaned = _TAINT_VALUE.sub("-", reason).strip("-_.")[:63].strip("-_.")
    return cleaned or "unhealthy"


def _attributes(gpu: GPU, kind: str, facts: GpuFacts) -> dict[str, dict[str, object]]:
    attrs: dict[str, dict[str, object]] = {
        contract.DRA_ATTR_TYPE: {"string": kind},
        "index": {"int": gpu.index},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": gpu.name},
    }
    if gpu.is_mig:  # a MIG device: its profile and its GPU (claims select by profile with CEL)
        attrs[contract.DRA_ATTR_MIG_PROFILE] = {"string": gpu.mig_profile}
        attrs[contract.DRA_ATTR_PARENT_UUID] = {"string": gpu.parent_uuid}
        if gpu.parent_index is not None:
            attrs[contract.DRA_ATTR_PARENT_INDEX] = {"int": gpu.parent_index}
    if gpu.nvlink_island is not None:  # a claim keeps its GPUs on one island with matchAttribute
        attrs[contract.DRA_ATTR_NVLINK_ISLAND] = {"int": gpu.nvlink_island}
    if gpu.numa_node is not None:
        attrs[contract.DRA_ATTR_NUMA_NODE] = {"int": gpu.numa_node}
    cc = semver(facts.compute_capability.get(gpu.uuid, ""))
    if cc:
        attrs["computeCapability"] = {"version": cc}
    driver = semver(facts.driver_version)
    if driver:
        attrs["driverVersion"] = {"version": driver}
    return attrs


def _taints(gpu: GPU, unhealthy: Mapping[str, str]) -> list[dict[str, str]]:
    if gpu.uuid not in unhealthy:
        return []
    return [{"key": contract.DRA_TAINT_UNHEALTHY, "value": taint_value(unhealthy[gpu.uuid]), "effect": "NoSchedule"}]


def _consumes(gpu: GPU) -> list[dict[str, object]]:
    return [{"counterSet": COUNTER_SET, "counters": {counter_name(gpu): {"value": "1"}}}]


def device_specs(gpus: Sequence[GPU], facts: GpuFacts, unhealthy: Mapping[str, str]) -> list[dict[str, object]]:
    """The devices slice's `devices`: per GPU the shared device then the whole one, in GPU index order (the
    scheduler takes the first that fits, so shares fill GPU 0 first: binpack)."""
    devices: list[dict[str, object]] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        offered = memory_offered(gpu.memory_bytes)
        if offered == 0:
            continue  # less memory than one share: nothing to offer
        share: dict[str, object] = {
            "name": share_name(gpu), "attributes": _attributes(gpu, contract.DRA_TYPE_SHARE, facts),
            "capacity": {contract.DRA_CAPACITY_MEMORY: memory_policy(offered),
                         contract.DRA_CAPACITY_CORES: cores_policy()},
            "allowMultipleAllocations": True, "consumesCounters": _consumes(gpu)}
        whole: dict[str, object] = {
            "name": whole_name(gpu), "attributes": _attributes(gpu, contract.DRA_TYPE_WHOLE, facts),
            "capacity": {contract.DRA_CAPACITY_MEMORY: {"value": str(offered)},
                         contract.DRA_CAPACITY_CORES: {"value": "100"}},
            "consumesCounters": _consumes(gpu)}
        taints = _taints(gpu, unhealthy)
        if taints:
            share["taints"] = taints
            whole["taints"] = [dict(t) for t in taints]
        devices += [share, whole]
    return devices


def counter_specs(gpus: Sequence[GPU]) -> list[dict[str, object]]:
    """The shared counter set, or [] when no GPU offers anything."""
    counters = {counter_name(g): {"value": "1"} for g in sorted(gpus, key=lambda g: g.index)
                if memory_offered(g.memory_bytes)}
    return [{"name": COUNTER_SET, "counters": counters}] if counters else []


def build_slices(node: str, gpus: Sequence[GPU], facts: GpuFacts, unhealthy: Mapping[str, str],
                 generation: int, node_uid: str = "") -> list[dict[str, object]]:
    """The node's two ResourceSlice objects at pool `generation`. `unhealthy`: GPU UUID -> reason; `node_uid`: the
    Node object's UID, when known, makes the Node their owner (deleting the Node deletes them, as for the
    kubelet's own slices). ValueError for more GPUs than one pool of two slices can describe."""
    if len(gpus) > MAX_GPUS:
        raise ValueError(f"{len(gpus)} GPUs: a DRA pool of this driver describes at most {MAX_GPUS}")
    counters_name, devices_name = slice_names(node)
    counters = counter_specs(gpus)
    # A node without a GPU to offer publishes an empty devices slice alone (a counter set needs a counter).
    pool = {"name": node, "generation": generation, "resourceSliceCount": SLICE_COUNT if counters else 1}

    def obj(name: str, body: dict[str, object]) -> dict[str, object]:
        meta: dict[str, object] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpushare-dra"}}
        if node_uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                        "controller": True}]
        return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
                "spec": {"driver": contract.DRA_DRIVER, "pool": dict(pool), "nodeName": node, **body}}

    devices = obj(devices_name, {"devices": device_specs(gpus, facts, unhealthy)})
    return [obj(counters_name, {"sharedCounters": counters}), devices] if counters else [devices]
