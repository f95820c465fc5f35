"""Containers that reserve no compute on a core_mem node: gpu-mem without gpu-core.percentage.

One rule, applied alike by the node daemon (placement, limits, env), the scheduler extender (fit) and the
validating webhook (a warning at creation), described in docs/guide/modes.md: such a container runs only on compute
nobody reserved. It goes only to a GPU where at least MIN_UNRESERVED percent of the compute is not reserved by
containers with a share, and reserves none of it (a container with a share may still take it); its shim lets it
take at most what nobody had reserved on that GPU when it was placed (the limits file's `sm_limit` with
`sm_unreserved=1`, and CUDA_DEVICE_SM_LIMIT), and only what its neighbours leave: it gives way whenever the GPU
is saturated. A paid share is thereby never reduced by a neighbour that paid for none. Pure.
"""

from __future__ import annotations

from devplugin.contract import CORE_PER_GPU, CORE_STEP

MODE = "core_mem"  # the only mode that holds containers to compute shares
MIN_UNRESERVED = CORE_STEP  # percent of a GPU's compute that must be unreserved for such a container to go there


def reserves_none(mode: str, mem: int, core: int) -> bool:
    """A share that asks for memory and no compute on a node that holds containers to compute shares."""
    return mode == MODE and mem > 0 and core == 0


def core_needed(mode: str, mem: int, core: int) -> int:
    """Compute percent that must be free (unreserved) on each GPU of a share: its own share, or MIN_UNRESERVED
    for a share that reserves none on a core_mem node (it reserves nothing, it only needs some to run on)."""
    return MIN_UNRESERVED if reserves_none(mode, mem, core) else core


def cap(free: int) -> int:
    """The most a container that reserved no compute may take of a GPU where `free` percent was unreserved when
    it was placed (at least 1: a container whose devices the kubelet handed on from an init container goes where
    they are)."""
    return min(max(free, 1), CORE_PER_GPU)


def advice(core_resource: str) -> str:
    """What to do when no GPU has compute nobody reserved: the end of a refusal."""
    return (f"a container that asks for no {core_resource} on a core_mem node runs only on compute nobody reserved "
            f"(at least {MIN_UNRESERVED} % of its GPU); ask for {core_resource} to reserve compute, run it on a cgpu "
            "node, or wait for containers with a compute share to end")
