"""The DRA mode's part of the report: per node and GPU, the claims allocated on it (namespace/name, the request, the
pods it is reserved for, the memory and cores it consumed, its shareID) and the GPU's capacity total / allocated /
free. Pure: built from apiserver JSON, the driver's ResourceSlices and the ResourceClaims, the same objects
kube-scheduler counts (it never allocates past a device's capacity, so `free` below zero means someone wrote an
allocation the scheduler did not make)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from decimal import ROUND_CEILING, Decimal, InvalidOperation

from kubernetes.utils import parse_quantity

from devplugin import contract

QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?")
OUR_CLASSES = (contract.DRA_DRIVER, "whole." + contract.DRA_DRIVER)  # the DeviceClasses deploy/components/dra ships


@dataclass
class ClaimOnGpu:
    namespace: str
    name: str
    request: str  # the claim's request (request/subrequest for a firstAvailable choice)
    pods: list[str]  # the pods it is reserved for (status.reservedFor), by name, in the claim's namespace
    memory: int  # bytes consumed (consumedCapacity; a whole GPU: all of it)
    cores: int  # percent consumed
    shareID: str  # "" for a whole GPU (an exclusive device has no shares)
    whole: bool


@dataclass
class DraGpu:
    index: int
    uuid: str
    model: str
    devices: list[str]  # the device names that stand for this GPU (gpu-N, gpu-N-whole)
    taints: list[str]  # key=value:effect of the devices' taints (an unhealthy GPU is tainted)
    memTotal: int  # bytes the GPU offers (its devices' memory capacity)
    memAllocated: int
    memFree: int
    coreTotal: int
    coreAllocated: int
    coreFree: int
    whole: bool  # held whole by a claim
    claims: list[ClaimOnGpu] = field(default_factory=list)


@dataclass
class DraNode:
    name: str
    gpus: list[DraGpu]
    memTotal: int
    memAllocated: int


@dataclass
class PendingClaim:
    namespace: str
    name: str
    requests: list[str]  # "gpu: memory 4Gi, cores 30 (gpu.gpushare.io)"
    pods: list[str]


@dataclass
class DraReport:
    driver: str
    nodes: list[DraNode]
    pending: list[PendingClaim]
    largestGpuMemory: int  # bytes: the most any one GPU offers (what kube-system/gpushare-dra-limits should say)
    limit: str  # largestGpuMemory of ConfigMap kube-system/gpushare-dra-limits ("" not set or not read)
    unplaced: list[str]  # allocations naming a device no current slice publishes: "ns/claim: pool/device"
    memTotal: int
    memAllocated: int
    node: str = ""  # the node asked for ("" every node)

    def to_json(self) -> dict:
        return asdict(self)


def _m(value: object) -> Mapping:
    """value when it is a mapping, else {}: a field of the wrong type reads as absent."""
    return value if isinstance(value, Mapping) else {}


def _l(value: object) -> list:
    return value if isinstance(value, list) else []


def _s(value: object) -> str:
    return value if isinstance(value, str) else ""


def is_quantity(text: str) -> bool:
    """A Kubernetes quantity as the apiserver (and CEL's isQuantity) reads one: no spaces, one suffix."""
    return bool(QUANTITY.fullmatch(text))


def quantity_int(raw: object) -> int:
    """A quantity as a whole number (a fraction rounded up); 0 when it is not one."""
    if not isinstance(raw, (str, int)) or isinstance(raw, bool) or len(str(raw)) > 64:
        return 0
    try:
        value: Decimal = parse_quantity(str(raw))
        return int(value.to_integral_value(rounding=ROUND_CEILING))
    except (ValueError, InvalidOperation, ArithmeticError):
        return 0


def _attr(device: Mapping, name: str) -> object:
    value = _m(_m(device.get("attributes")).get(name))
    for kind in ("string", "int", "version", "bool"):
        if kind in value:
            return value[kind]
    return None


def _capacity(device: Mapping, name: str) -> int:
    return max(0, quantity_int(_m(_m(device.get("capacity")).get(name)).get("value", 0)))


def _taint(t: Mapping) -> str:
    value = f"={_s(t.get('value'))}" if _s(t.get("value")) else ""
    return f"{_s(t.get('key'))}{value}:{_s(t.get('effect'))}"


def _pool(s: Mapping) -> tuple[str, int]:
    pool = _m(_m(s.get("spec")).get("pool"))
    generation = pool.get("generation", 0)
    return _s(pool.get("name")), generation if isinstance(generation, int) and not isinstance(generation, bool) else 0


def current_slices(slices: Iterable[Mapping], driver: str = contract.DRA_DRIVER) -> list[Mapping]:
    """The driver's slices of each pool's newest generation (older ones are being replaced)."""
    ours = [s for s in slices if isinstance(s, Mapping) and _m(s.get("spec")).get("driver") == driver]
    newest: dict[str, int] = {}
    for s in ours:
        name, generation = _pool(s)
        newest[name] = max(newest.get(name, generation), generation)
    return [s for s in ours if _pool(s)[1] == newest[_pool(s)[0]]]


def _request_text(name: str, ask: Mapping) -> str:
    caps = _m(_m(ask.get("capacity")).get("requests"))
    what = ", ".join(f"{k} {v}" for k, v in sorted((str(k), str(v)) for k, v in caps.items())) or "defaults"
    count = ask.get("count", 1)
    many = f" x{count}" if ask.get("allocationMode", "ExactCount") == "ExactCount" and count != 1 else ""
    return f"{name}: {what}{many} ({_s(ask.get('deviceClassName'))})"


def _asks(claim: Mapping) -> list[tuple[str, Mapping]]:
    out: list[tuple[str, Mapping]] = []
    for r in _l(_m(_m(claim.get("spec")).get("devices")).get("requests")):
        r = _m(r)
        if isinstance(r.get("exactly"), Mapping):
            out.append((_s(r.get("name")), r["exactly"]))
        for sub in _l(r.get("firstAvailable")):
            out.append((f"{_s(r.get('name'))}/{_s(_m(sub).get('name'))}", _m(sub)))
    return out


def _pods(claim: Mapping) -> list[str]:
    return sorted(_s(_m(r).get("name")) for r in _l(_m(claim.get("status")).get("reservedFor"))
                  if _m(r).get("resource") == "pods")


def build_dra_report(slices: Iterable[Mapping], claims: Iterable[Mapping], node: str = "", limit: str = "",
                     driver: str = contract.DRA_DRIVER) -> DraReport:
    """Every node with the driver's devices (or the one named), its GPUs and the claims on them; the claims of our
    DeviceClasses not allocated yet (when no node is named)."""
    gpus: dict[tuple[str, str], DraGpu] = {}  # (node, GPU key) -> GPU
    where: dict[tuple[str, str], tuple[tuple[str, str], bool]] = {}  # (pool, device) -> (GPU, whole)
    largest = 0
    for s in current_slices(slices, driver):
        spec = _m(s.get("spec"))
        node_name, pool = _s(spec.get("nodeName")), _pool(s)[0]
        for d in _l(spec.get("devices")):
            d = _m(d)
            name, uuid = _s(d.get("name")), _s(_attr(d, "uuid"))
            key = (node_name, uuid or name)
            memory, cores = _capacity(d, contract.DRA_CAPACITY_MEMORY), _capacity(d, contract.DRA_CAPACITY_CORES)
            largest = max(largest, memory)
            g = gpus.get(key)
            if g is None:
                index = _attr(d, "index")
                g = gpus[key] = DraGpu(index if isinstance(index, int) and not isinstance(index, bool) else -1, uuid,
                                       _s(_attr(d, "productName")), [], [], memory, 0, 0, cores, 0, 0, False)
            g.devices.append(name)
            g.taints += [t for t in (_taint(_m(t)) for t in _l(d.get("taints"))) if t not in g.taints]
            g.memTotal, g.coreTotal = max(g.memTotal, memory), max(g.coreTotal, cores)
            where[(pool, name)] = (key, _attr(d, contract.DRA_ATTR_TYPE) == contract.DRA_TYPE_WHOLE)
    pending: list[PendingClaim] = []
    unplaced: list[str] = []
    for claim in claims:
        claim = _m(claim)
        meta = _m(claim.get("metadata"))
        ns, name = _s(meta.get("namespace")), _s(meta.get("name"))
        allocation = _m(_m(claim.get("status")).get("allocation"))
        if not allocation:
            asks = [(n, a) for n, a in _asks(claim) if a.get("deviceClassName") in OUR_CLASSES]
            if asks and not node:
                pending.append(PendingClaim(ns, name, [_request_text(n, a) for n, a in asks], _pods(claim)))
            continue
        for result in _l(_m(allocation.get("devices")).get("results")):
            result = _m(result)
            if result.get("driver") != driver:
                continue
            pool, device = _s(result.get("pool")), _s(result.get("device"))
            found = where.get((pool, device))
            if found is None:
                if not node:
                    unplaced.append(f"{ns}/{name}: {pool}/{device}")
                continue
            g, whole = gpus[found[0]], found[1]
            consumed = _m(result.get("consumedCapacity"))
            memory = g.memTotal if whole else max(0, quantity_int(consumed.get(contract.DRA_CAPACITY_MEMORY, 0)))
            cores = g.coreTotal if whole else max(0, quantity_int(consumed.get(contract.DRA_CAPACITY_CORES, 0)))
            g.claims.append(ClaimOnGpu(ns, name, _s(result.get("request")), _pods(claim), memory, cores,
                                       _s(result.get("shareID")), whole))
            g.whole = g.whole or whole
    nodes: dict[str, list[DraGpu]] = {}
    for (node_name, _), g in gpus.items():
        if node and node_name != node:
            continue
        g.memAllocated = sum(c.memory for c in g.claims)
        g.coreAllocated = sum(c.cores for c in g.claims)
        g.memFree, g.coreFree = g.memTotal - g.memAllocated, g.coreTotal - g.coreAllocated
        g.claims.sort(key=lambda c: (c.namespace, c.name, c.request))
        g.devices.sort()
        nodes.setdefault(node_name, []).append(g)
    out = [DraNode(n, sorted(gs, key=lambda g: (g.index, g.uuid)), sum(g.memTotal for g in gs),
                   sum(g.memAllocated for g in gs)) for n, gs in sorted(nodes.items())]
    return DraReport(driver, out, sorted(pending, key=lambda p: (p.namespace, p.name)), largest, limit,
                     sorted(unplaced), sum(n.memTotal for n in out), sum(n.memAllocated for n in out), node)
