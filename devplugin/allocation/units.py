"""Virtual device units: GPUs turned into countable kubelet devices, and the IDs that name them.

gpu-mem: one device per memory unit of each GPU (GiB by default); gpu-core.percentage: 100 devices per GPU;
gpu-count: one device per GPU. Every ID encodes its GPU's UUID, so any set of IDs maps back to GPUs:
    <uuid>::m<n>   gpu-mem unit n          e.g. GPU-0b7c...-e5::m12
    <uuid>::c<n>   gpu-core.percentage n
    <uuid>::g      the whole GPU
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from devplugin.gpu.device import GPU

MiB = 1 << 20
MAX_ID_LENGTH = 63  # kubelet: Device.ID is at most 63 characters
KUBELET_MAX_MESSAGE = 4 * MiB  # the kubelet's gRPC client keeps the default 4 MiB receive limit
_MESSAGE_MARGIN = 64 * 1024  # headroom below the limit for framing and future fields
CORE_UNITS_PER_GPU = 100
CORE_STEP = 5


class Kind(enum.Enum):
    """The three resources, by the short name after the domain."""

    MEM = "gpu-mem"
    CORE = "gpu-core.percentage"
    COUNT = "gpu-count"

    # Members are singletons: hash by identity (Enum's own __hash__ runs Python code on every dict lookup, and the
    # admission path looks kinds up hundreds of thousands of times).
    __hash__ = object.__hash__

    @property
    def code(self) -> str:
        return {"gpu-mem": "m", "gpu-core.percentage": "c", "gpu-count": "g"}[self.value]

    def resource_name(self, domain: str) -> str:
        return f"{domain}/{self.value}"


_BY_CODE = {k.code: k for k in Kind}


class InvalidDeviceID(ValueError):
    """A device ID that this daemon did not and could not have advertised."""


class UnitTooFine(ValueError):
    """A gpu-mem unit so fine that ListAndWatch would exceed the kubelet's 4 MiB message limit."""


@dataclass(frozen=True)
class MemUnit:
    """The size of one gpu-mem device."""

    mib: int

    @property
    def bytes(self) -> int:
        return self.mib * MiB

    @property
    def name(self) -> str:
        return "GiB" if self.mib == 1024 else f"{self.mib}MiB"


ALLOWED_UNITS_MIB = tuple(1 << i for i in range(11))  # 1 MiB .. 1 GiB, powers of two


def parse_mem_unit(text: str) -> MemUnit:
    """Parse `GiB`, `1GiB`, `512MiB`, `256MiB`, `128MiB` (any power of two from 1 MiB to 1 GiB)."""
    raw = text.strip()
    low = raw.lower()
    mib: int | None = None
    if low in ("gib", "1gib", "g", "1g"):
        mib = 1024
    else:
        digits = low.removesuffix("mib").removesuffix("m")
        if digits.isdigit():
            mib = int(digits)
    if mib not in ALLOWED_UNITS_MIB:
        raise ValueError(
            f"gpu-mem unit {text!r} is not valid: use GiB (default), 512MiB, 256MiB or 128MiB "
            "(any power of two from 1MiB to 1024MiB is accepted if the node's device list stays under 4 MiB)"
        )
    return MemUnit(mib)


def encode_id(uuid: str, kind: Kind, n: int = 0) -> str:
    """The device ID of unit n of `kind` on the GPU with this UUID."""
    dev_id = f"{uuid}::{kind.code}" if kind is Kind.COUNT else f"{uuid}::{kind.code}{n}"
    if len(dev_id) > MAX_ID_LENGTH:
        raise InvalidDeviceID(f"device ID {dev_id!r} is longer than the kubelet's {MAX_ID_LENGTH} characters")
    return dev_id


def decode_id(dev_id: str) -> tuple[str, Kind, int]:
    """(uuid, kind, n) of a device ID; InvalidDeviceID if it is not one of ours."""
    uuid, sep, tail = dev_id.rpartition("::")
    if not sep or not uuid or not tail or tail[0] not in _BY_CODE:
        raise InvalidDeviceID(f"{dev_id!r} is not a device ID of this plugin (expected <GPU UUID>::m<n>|c<n>|g)")
    kind = _BY_CODE[tail[0]]
    rest = tail[1:]
    if kind is Kind.COUNT:
        if rest:
            raise InvalidDeviceID(f"{dev_id!r}: a gpu-count ID carries no unit number")
        return uuid, kind, 0
    if not rest.isdigit() or (len(rest) > 1 and rest[0] == "0"):
        raise InvalidDeviceID(f"{dev_id!r}: unit number {rest!r} is not a plain non-negative integer")
    return uuid, kind, int(rest)


def units_per_gpu(gpu: GPU, kind: Kind, unit: MemUnit) -> int:
    """How many devices of `kind` one GPU provides (each GPU its own size)."""
    if kind is Kind.MEM:
        return gpu.memory_bytes // unit.bytes
    if kind is Kind.CORE:
        return CORE_UNITS_PER_GPU
    return 1


def device_ids(gpu: GPU, kind: Kind, unit: MemUnit) -> list[str]:
    """All device IDs of `kind` on one GPU, in unit order."""
    return [encode_id(gpu.uuid, kind, n) for n in range(units_per_gpu(gpu, kind, unit))]


def _device_message_bound(gpu: GPU, kind: Kind, count: int) -> int:
    """Upper bound of the serialized size of one Device entry inside ListAndWatchResponse."""
    id_len = len(encode_id(gpu.uuid, kind, max(count - 1, 0)))
    health = len("Unhealthy")
    topology = 2 + 2 + 11  # TopologyInfo{nodes{ID}} with a varint NUMA id
    body = (1 + 1 + id_len) + (1 + 1 + health) + (1 + 1 + topology)
    return 1 + 2 + body  # field tag + length prefix of the repeated Device


def list_and_watch_bound(gpus: list[GPU], kind: Kind, unit: MemUnit) -> int:
    """Upper bound, in bytes, of the ListAndWatch message for `kind` on this node."""
    total = 0
    for gpu in gpus:
        count = units_per_gpu(gpu, kind, unit)
        total += count * _device_message_bound(gpu, kind, count)
    return total


def check_message_size(gpus: list[GPU], unit: MemUnit, limit: int = KUBELET_MAX_MESSAGE) -> None:
    """Refuse a gpu-mem unit whose device list would not fit in one kubelet message; name a unit that fits."""
    size = list_and_watch_bound(gpus, Kind.MEM, unit)
    if size <= limit - _MESSAGE_MARGIN:
        return
    coarser = [MemUnit(m) for m in ALLOWED_UNITS_MIB if m > unit.mib]
    fits = [u for u in coarser if list_and_watch_bound(gpus, Kind.MEM, u) <= limit - _MESSAGE_MARGIN]
    total_gib = sum(g.memory_bytes for g in gpus) / (1024 * MiB)
    hint = f"use --mem-unit {fits[0].name} or coarser" if fits else "no unit fits; split the node"
    raise UnitTooFine(
        f"gpu-mem unit {unit.name} on {len(gpus)} GPUs ({total_gib:.0f} GiB) makes a ListAndWatch message of "
        f"about {size / MiB:.1f} MiB, over the kubelet's 4 MiB gRPC limit (the resource would drop to zero): "
        f"{hint}"
    )
