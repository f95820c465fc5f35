"""A ResourceClaim's allocation, as the scheduler wrote it, turned into what this node prepares: pure, no I/O.

Everything here is checked, because a claim is a tenant's object and its status is only as good as the component
that wrote it: results of other drivers are left to them; a result of this driver must name this node's pool and
one of its devices; a share must carry a `shareID` and a `consumedCapacity` that this GPU offers (on the steps,
never above the device); the shares of one claim on one GPU add up (one budget per claim) and must fit the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from devplugin import contract
from devplugin.dra.capacity import CapacityError, check_share, memory_offered, parse_amount
from devplugin.dra.slices import DeviceRef
from devplugin.gpu.device import GPU

MAX_RESULTS = 32  # allocation results of one claim this node accepts (a request may ask count: N)
MAX_NAME = 253


class ClaimError(ValueError):
    """A claim this node cannot prepare; the message names the claim, the device or GPU and the capacity."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Share:
    """One allocation result of this driver: a share of a GPU (memory bytes, cores percent) or the whole GPU."""

    request: str
    pool: str
    device: str
    gpu: GPU
    whole: bool
    memory: int  # bytes; for a whole GPU what it offers
    cores: int  # percent
    share_id: str  # "" for a whole GPU

    @property
    def base_request(self) -> str:
        """The claim's request ("gpus" of a firstAvailable subrequest "gpus/big"): what containers name."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class GpuBudget:
    """What one claim may use on one GPU: the sum of its shares there (or the whole GPU)."""

    gpu: GPU
    whole: bool
    memory: int
    cores: int


def _text(value: object, what: str, ref: ClaimRef, limit: int = MAX_NAME) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ClaimError(f"claim {ref}: {what} {str(value)[:80]!r} is not a name")
    return value


def _dict(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _share(result: Mapping[str, object], ref: ClaimRef, node: str, devices: Mapping[str, DeviceRef]) -> Share:
    device = _text(result.get("device"), "device", ref)
    pool = _text(result.get("pool"), "pool", ref)
    request = _text(result.get("request"), "request", ref)
    if pool != node:
        raise ClaimError(f"claim {ref}: device {device} of pool {pool!r} is not on this node ({node}): the claim "
                         "was allocated elsewhere; delete the pod so that it is scheduled again")
    known = devices.get(device)
    if known is None:
        raise ClaimError(f"claim {ref}: device {device!r} is not a device of this node (it has "
                         f"{', '.join(sorted(devices)) or 'none'}): the GPU is gone or the slice changed since the "
                         "claim was allocated; delete the pod so that it is scheduled again")
    gpu, offered = known.gpu, known.offered
    if known.whole:
        return Share(request, pool, device, gpu, True, offered.memory, offered.cores, "")
    share_id = _text(result.get("shareID"), "shareID of device " + device, ref, 64)
    consumed = result.get("consumedCapacity")
    if not isinstance(consumed, dict):
        raise ClaimError(f"claim {ref}: device {device} (GPU {gpu.index}, {gpu.uuid}) has no consumedCapacity: a "
                         "share needs the memory and cores the scheduler granted")
    amounts = {}
    for name in (contract.DRA_CAPACITY_MEMORY, contract.DRA_CAPACITY_CORES):
        if name not in consumed:
            raise ClaimError(f"claim {ref}: device {device} (GPU {gpu.index}, {gpu.uuid}): consumedCapacity has no "
                             f"{name!r}")
        try:
            amounts[name] = parse_amount(name, consumed[name])
        except CapacityError as exc:
            raise ClaimError(f"claim {ref}: device {device} (GPU {gpu.index}, {gpu.uuid}): {exc}") from None
    memory, cores = amounts[contract.DRA_CAPACITY_MEMORY], amounts[contract.DRA_CAPACITY_CORES]
    try:
        check_share(memory, cores, offered)
    except CapacityError as exc:
        raise ClaimError(f"claim {ref}: device {device} (GPU {gpu.index}, {gpu.uuid}): consumed {exc}") from None
    return Share(request, pool, device, gpu, False, memory, cores, share_id)


def shares_of(claim: object, ref: ClaimRef, node: str, devices: Mapping[str, DeviceRef]) -> list[Share]:
    """This driver's allocation results of `claim` (the ResourceClaim as JSON); ClaimError saying what is wrong."""
    if not isinstance(claim, dict):
        raise ClaimError(f"claim {ref}: the apiserver answered something that is not a ResourceClaim")
    uid = _dict(claim.get("metadata")).get("uid")
    if uid != ref.uid:
        raise ClaimError(f"claim {ref} has UID {uid!r}, the kubelet asked for {ref.uid!r}: the claim was deleted and "
                         "created again; the pod must be deleted and created again too")
    allocation = _dict(_dict(claim.get("status")).get("allocation"))
    results = _dict(allocation.get("devices")).get("results")
    if not allocation or not isinstance(results, list):
        raise ClaimError(f"claim {ref} is not allocated (status.allocation is empty): nothing to prepare")
    ours = [r for r in results if isinstance(r, dict) and r.get("driver") == contract.DRA_DRIVER]
    if not ours:
        raise ClaimError(f"claim {ref} has no device of driver {contract.DRA_DRIVER}")
    if len(ours) > MAX_RESULTS:
        raise ClaimError(f"claim {ref} has {len(ours)} devices of {contract.DRA_DRIVER}; at most {MAX_RESULTS}")
    return [_share(r, ref, node, devices) for r in ours]


def budgets(shares: list[Share], ref: ClaimRef) -> list[GpuBudget]:
    """One budget per GPU the claim uses, in GPU index order: shares on one GPU add up; ClaimError when they do not
    fit the GPU or a GPU is both whole and shared in one claim."""
    by_gpu: dict[str, list[Share]] = {}
    for s in shares:
        by_gpu.setdefault(s.gpu.uuid, []).append(s)
    out = []
    for group in sorted(by_gpu.values(), key=lambda g: g[0].gpu.index):
        gpu = group[0].gpu
        if any(s.whole for s in group):
            if len(group) > 1:
                raise ClaimError(f"claim {ref}: GPU {gpu.index} ({gpu.uuid}) is allocated whole and as a share in one "
                                 "claim; the scheduler never does that: delete the pod so that it is scheduled again")
            out.append(GpuBudget(gpu, True, group[0].memory, group[0].cores))
            continue
        memory, cores = sum(s.memory for s in group), sum(s.cores for s in group)
        offered = memory_offered(gpu.memory_bytes)
        if memory > offered:
            raise ClaimError(f"claim {ref}: its shares of GPU {gpu.index} ({gpu.uuid}) add up to memory {memory} "
                             f"bytes, more than the {offered} it offers")
        if cores > contract.CORE_PER_GPU:
            raise ClaimError(f"claim {ref}: its shares of GPU {gpu.index} ({gpu.uuid}) add up to cores {cores}, more "
                             f"than {contract.CORE_PER_GPU}")
        out.append(GpuBudget(gpu, False, memory, cores))
    return out


def claim_limits(budgets_: list[GpuBudget]) -> contract.Limits | None:
    """The limits file of the claim's shares (a whole GPU of a mixed claim: unlimited there); None when the claim
    takes whole GPUs only (no shim: the GPU is the container's)."""
    if all(b.whole for b in budgets_):
        return None
    return contract.Limits(devices=tuple(
        contract.DeviceLimit(uuid=b.gpu.uuid, memory_limit=0 if b.whole else b.memory,
                             sm_limit=100 if b.whole else b.cores) for b in budgets_))
