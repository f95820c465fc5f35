"""One container, one decision: pair a container's gpu-mem and gpu-core.percentage on the same GPU.

The kubelet admits containers one at a time and, within a container, calls GetPreferredAllocation and
Allocate for each of its resources in turn, in random order, with no pod identity. A decision opened by the
first of a container's two shared resources is joined by the second when it comes next. It ends when both are
allocated, when a resource it already has is called again (that is the next container), when a gpu-count call
comes, or after `window_s` without calls. Containers that ask for only one of the two on a core_mem node
(against the node's rule) can be mis-paired with the next container; pod lookup resolves that case.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from devplugin.units import Kind

SHARED = (Kind.MEM, Kind.CORE)


@dataclass
class Decision:
    """Where one container's resources go and what it got so far."""

    gpus: tuple[str, ...]
    preferred: dict[Kind, list[str]] = field(default_factory=dict)
    allocated: dict[Kind, list[str]] = field(default_factory=dict)
    touched: float = 0.0
    alloc_id: str = ""

    def amount(self, kind: Kind) -> int:
        return len(self.allocated.get(kind, ()))


def allocation_id(ids: list[str]) -> str:
    """A stable short name for a container's allocation, derived from device IDs it holds."""
    return hashlib.sha256(",".join(sorted(ids)).encode()).hexdigest()[:20]


class PairingBook:
    """Holds the one open decision (the kubelet serialises admissions)."""

    def __init__(self, expects: tuple[Kind, ...], window_s: float = 2.0) -> None:
        self._expects = tuple(k for k in SHARED if k in expects)
        self._window = window_s
        self._open: Decision | None = None

    def current(self, kind: Kind, for_allocate: bool) -> Decision | None:
        """The open decision this call belongs to, or None (closing a stale one)."""
        dec = self._open
        now = time.monotonic()
        if dec is None:
            return None
        joinable = (
            kind in SHARED
            and now - dec.touched <= self._window
            and kind not in dec.allocated
            and (for_allocate or kind not in dec.preferred)
            and all(k in SHARED for k in (*dec.allocated, *dec.preferred))
        )
        if not joinable:
            self._open = None
            return None
        dec.touched = now
        return dec

    def close(self) -> None:
        """End the open decision: a refused call means the kubelet rejects the pod and moves on."""
        self._open = None

    def open(self, gpus: tuple[str, ...]) -> Decision:
        dec = Decision(gpus=gpus, touched=time.monotonic())
        self._open = dec
        return dec

    def allocated(self, dec: Decision, kind: Kind, ids: list[str]) -> None:
        """Record an Allocate; close the decision when the container has all it can have."""
        dec.allocated[kind] = ids
        if not dec.alloc_id:
            dec.alloc_id = allocation_id(ids)
        if kind is Kind.COUNT or all(k in dec.allocated for k in self._expects):
            if self._open is dec:
                self._open = None
