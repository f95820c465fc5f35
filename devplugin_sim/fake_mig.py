"""MIG devices of the simulated driver: what a `mig` line of the fake's config says (fakes/fake_gpu_mig.h).

A GPU in MIG mode is split into MIG devices (a GPU instance with its compute instance), each with its own UUID
(`MIG-...`), memory and SMs. `FakeGPU(mig=True, mig_devices=mig_devices(...))` describes one; the fake NVML
answers NVML's MIG calls for it and the fake libcuda enumerates its MIG devices as CUDA does.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass

_MIG_NAMESPACE = uuidlib.UUID("0c1f6a52-3d5e-4f6b-8a7c-9d0e1f2a3b4c")

# The A100-SXM4-80GB's profiles: memory NVML reports for each (MiB) and its SMs.
A100_80GB_PROFILES: dict[str, tuple[int, int]] = {
    "1g.10gb": (9728, 14), "2g.20gb": (19968, 28), "3g.40gb": (40192, 42), "4g.40gb": (40192, 56),
    "7g.80gb": (80896, 98),
}


@dataclass(frozen=True)
class FakeMig:
    """One MIG device of a GPU, as its `mig` config line describes it."""

    uuid: str  # "MIG-..."
    profile: str  # "1g.10gb"
    memory_mib: int
    sms: int
    gi: int  # GPU instance id
    ci: int = 0  # compute instance id

    def config_line(self, parent_uuid: str, slot: int) -> str:
        """The config's mig line; slot: the MIG device's entry in the node's state file."""
        return (f"mig parent={parent_uuid} uuid={self.uuid} profile={self.profile} memory_mib={self.memory_mib} "
                f"sms={self.sms} gi={self.gi} ci={self.ci} slot={slot}")


def mig_uuid(node: str, gpu_index: int, n: int, profile: str) -> str:
    """A stable MIG device UUID in NVIDIA's format (MIG-xxxxxxxx-xxxx-...); another profile in the same place is
    another MIG device, with another UUID, as when an operator re-creates instances."""
    return f"MIG-{uuidlib.uuid5(_MIG_NAMESPACE, f'{node}/{gpu_index}/{n}/{profile}')}"


def mig_devices(node: str, gpu_index: int, profiles: Sequence[str],
                table: dict[str, tuple[int, int]] = A100_80GB_PROFILES) -> tuple[FakeMig, ...]:
    """MIG devices of these profiles (A100 80GB sizes by default), GPU instance ids 1, 2, ..., stable UUIDs."""
    unknown = [p for p in profiles if p not in table]
    if unknown:
        raise ValueError(f"unknown MIG profile(s) {', '.join(unknown)}; known: {', '.join(table)}")
    return tuple(FakeMig(uuid=mig_uuid(node, gpu_index, n, p), profile=p, memory_mib=table[p][0], sms=table[p][1],
                         gi=n + 1) for n, p in enumerate(profiles))
