"""Fake GPU layouts with MIG: the node the MIG tests, the demo and the realk8s cluster use."""

from __future__ import annotations

from collections.abc import Sequence

from devplugin_sim.fake_driver import FakeGPU, seed_uuid
from devplugin_sim.fake_mig import mig_devices

A100_80GB = "NVIDIA A100-SXM4-80GB"


def a100(node: str, index: int, *, mig: bool | None = None, mig_pending: bool | None = None,
         profiles: Sequence[str] = ()) -> FakeGPU:
    """An A100 80GB at `index`, MIG-capable when `mig` is not None, split into `profiles` when mig is True."""
    return FakeGPU(index=index, uuid=seed_uuid(index, node), name=A100_80GB, memory_mib=81920, minor=index,
                   pci_bus_id=f"00000000:{0x10 + index:02X}:00.0", numa_node=0, sms=108, compute_capability=(8, 0),
                   mig=mig, mig_pending=mig_pending,
                   mig_devices=mig_devices(node, index, profiles) if profiles else ())


def mig_node(node: str = "mig") -> list[FakeGPU]:
    """GPU 0 a plain A100 (MIG off), GPU 1 in MIG mode as 3g.40gb + 2g.20gb + 1g.10gb, GPU 2 MIG-capable
    with MIG off."""
    return [a100(node, 0, mig=False), a100(node, 1, mig=True, profiles=("3g.40gb", "2g.20gb", "1g.10gb")),
            a100(node, 2, mig=False)]


def served_mib(layout: Sequence[FakeGPU]) -> list[int]:
    """The memory (MiB) of each device the node daemon serves healthy on this layout: a GPU whole, a MIG-enabled
    GPU as its MIG devices; a GPU whose MIG mode waits for a reset serves nothing healthy."""
    out: list[int] = []
    for gpu in layout:
        if gpu.mig_pending is not None and gpu.mig is not None and gpu.mig_pending != gpu.mig:
            continue
        out += [m.memory_mib for m in gpu.mig_devices] if gpu.mig else [gpu.memory_mib]
    return out
