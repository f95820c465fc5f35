"""The capacities a GPU offers through DRA and their request policies: pure arithmetic, no I/O.

`memory` is bytes on a 256 MiB step (the smallest share 256 MiB, the largest the GPU's memory rounded down to the
step); `cores` is percent of the GPU's compute, 5 to 100 on a step of 5. A capacity a claim does not name takes
its `default`, the smallest share (256 MiB, 5 %): a claim asks for what it needs by name (docs/reference/dra-node.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from kubernetes.utils import parse_quantity

from devplugin import contract

MiB = 1 << 20
MEMORY_STEP = 256 * MiB
MEMORY_MIN = MEMORY_STEP
CORES_STEP = contract.CORE_STEP
CORES_MIN = CORES_STEP
CORES_MAX = contract.CORE_PER_GPU
MAX_QUANTITY_LEN = 64  # a Kubernetes quantity is short; anything longer is refused before parsing
MAX_AMOUNT = 1 << 62  # far above any GPU; bounds the integer a quantity such as 1e400000 would make


class CapacityError(ValueError):
    """A quantity that is not one a GPU share can be: the message names the capacity and the value."""


@dataclass(frozen=True)
class GpuCapacity:
    """What one GPU offers: memory (bytes, a multiple of MEMORY_STEP) and cores (percent)."""

    memory: int
    cores: int = CORES_MAX


def memory_offered(memory_bytes: int) -> int:
    """The GPU's memory rounded down to the step: the largest share and the device's `memory` capacity. 0 when the
    GPU has less than one step."""
    if memory_bytes < 0:
        raise CapacityError(f"GPU memory {memory_bytes} bytes is negative")
    return memory_bytes // MEMORY_STEP * MEMORY_STEP


def parse_amount(name: str, raw: object) -> int:
    """A quantity from the apiserver (`4Gi`, `30`, `1073741824`) as a whole number; CapacityError when it is not a
    string, not a quantity, fractional or negative."""
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        raise CapacityError(f"capacity {name!r}: {raw!r} is not a quantity")
    text = str(raw)
    if not text or len(text) > MAX_QUANTITY_LEN:
        raise CapacityError(f"capacity {name!r}: {text[:MAX_QUANTITY_LEN]!r} is not a quantity")
    try:
        value: Decimal = parse_quantity(text)
    except (ValueError, InvalidOperation, ArithmeticError):
        raise CapacityError(f"capacity {name!r}: {text!r} is not a quantity") from None
    if value.is_finite() and abs(value) > MAX_AMOUNT:
        raise CapacityError(f"capacity {name!r}: {text!r} is larger than any GPU")
    if not value.is_finite() or value != value.to_integral_value():
        raise CapacityError(f"capacity {name!r}: {text!r} is not a whole number")
    if value < 0:
        raise CapacityError(f"capacity {name!r}: {text!r} is negative")
    return int(value)


def check_share(memory: int, cores: int, offered: GpuCapacity) -> None:
    """A share the scheduler recorded must be one this GPU offers: on the steps, within min..max. CapacityError
    naming the capacity otherwise (a share above the device would let the container use a neighbour's room)."""
    if not MEMORY_MIN <= memory <= offered.memory or memory % MEMORY_STEP:
        raise CapacityError(f"memory {memory} bytes is not a multiple of {MEMORY_STEP} from {MEMORY_MIN} to "
                            f"{offered.memory} (what this GPU offers)")
    if not CORES_MIN <= cores <= offered.cores or cores % CORES_STEP:
        raise CapacityError(f"cores {cores} is not a multiple of {CORES_STEP} from {CORES_MIN} to {offered.cores}")


def memory_policy(offered: int) -> dict[str, object]:
    """The `memory` capacity of a shared device: value and request policy (default and min the smallest share)."""
    return {"value": str(offered),
            "requestPolicy": {"default": str(MEMORY_MIN),
                              "validRange": {"min": str(MEMORY_MIN), "max": str(offered),
                                             "step": str(MEMORY_STEP)}}}


def cores_policy() -> dict[str, object]:
    """The `cores` capacity of a shared device: 100, shares of 5 to 100 by 5, default 5."""
    return {"value": str(CORES_MAX),
            "requestPolicy": {"default": str(CORES_MIN),
                              "validRange": {"min": str(CORES_MIN), "max": str(CORES_MAX),
                                             "step": str(CORES_STEP)}}}
