"""One container, one decision: pair a container's gpu-mem and gpu-core.percentage on the same GPU.

The kubelet admits containers one at a time and, within a container, calls GetPreferredAllocation and
Allocate for each of its resources in turn, in random order, with no pod identity. A decision opened by the
first of a container's two shared resources is joined by the second when it comes next. It ends when a
resource it already has is called again (that is the next container), when a gpu-count call comes, when a
call is refused, or after `window_s` without calls.

When the kubelet rejects a container by itself after its first resource (too few devices of the second), the
next container's first call may join the stale decision; its second call then finds the stale devices back in
`available` and takes their place (forget_rolled_back). This is the fallback when the pod cache cannot
name the container (no apiserver): containers that ask for only one of the two on a core_mem node can then be
mis-paired with the next container.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from devplugin.allocation.decision import Decision
from devplugin.allocation.units import Kind

SHARED = (Kind.MEM, Kind.CORE)


class PairingBook:
    """Holds the one open decision (the kubelet serialises admissions)."""

    def __init__(self, window_s: float = 1.0) -> None:
        self._window = window_s
        self._open: Decision | None = None

    def current(self, kind: Kind, for_allocate: bool) -> Decision | None:
        """The open decision this call belongs to, or None (closing a stale one)."""
        dec = self._open
        if dec is None:
            return None
        if not self.joinable(kind, for_allocate):
            self._open = None
            return None
        dec.touched = time.monotonic()
        return dec

    def joinable(self, kind: Kind, for_allocate: bool) -> bool:
        """A call of `kind` would join the open decision (no side effects)."""
        dec = self._open
        return (
            dec is not None
            and kind in SHARED
            and time.monotonic() - dec.touched <= self._window
            and kind not in dec.allocated
            and (for_allocate or kind not in dec.preferred)
            and all(k in SHARED for k in (*dec.allocated, *dec.preferred))
        )

    def forget_rolled_back(self, kind: Kind, available: Mapping[str, set[str]]) -> None:
        """Drop `kind` from the open decision if the kubelet offers its devices again.

        The kubelet can reject a container by itself (too few devices of its next resource) without calling
        us; it then releases what the container got. Seeing those IDs back in `available` (by GPU) tells us so.
        """
        dec = self._open
        if dec is None or kind not in dec.allocated:
            return
        offered = set().union(*(available.get(uuid, ()) for uuid in dec.gpus))
        if not offered.issuperset(dec.allocated[kind]):
            return
        del dec.allocated[kind]
        dec.preferred.pop(kind, None)
        if not dec.allocated:
            self._open = None

    def close(self) -> None:
        """End the open decision: a refused call means the kubelet rejects the pod and moves on."""
        self._open = None

    def open(self, gpus: tuple[str, ...]) -> Decision:
        return self.adopt(Decision(gpus=gpus, touched=time.monotonic()))

    def adopt(self, dec: Decision) -> Decision:
        """Make `dec` the open decision."""
        dec.touched = time.monotonic()
        self._open = dec
        return dec

    def allocated(self, dec: Decision, kind: Kind, ids: list[str]) -> None:
        """Record an Allocate. A complete decision stays open until the next call: if the kubelet rejected the
        previous container by itself, that call shows its devices back in `available` (forget_rolled_back)."""
        dec.allocated[kind] = ids
        if kind is Kind.COUNT and self._open is dec:
            self._open = None
