"""The readmission memory: containers recorded on their pod that a restarted kubelet forgot, and may admit again.

A kubelet that stopped after a container's Allocate but before writing its checkpoint forgets that allocation and,
once restarted, admits the pod again: the same container asks again, though the daemon recorded it on its pod. For
READMIT_WINDOW_S after a restart, a recorded container whose devices the kubelet offers again (its device manager no
longer holds them, a stronger sign than PodResources not listing them) is taken as being admitted again
(which_container.py), not as done. State only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from devplugin.allocation.holdings import Holding

READMIT_WINDOW_S = 120.0


@dataclass
class Readmission:
    until: float = 0.0  # READMIT_WINDOW_S after the kubelet's last restart
    _forgotten: set[tuple[str, str]] = field(default_factory=set)  # (pod UID, container)

    def kubelet_restarted(self, now: float) -> None:
        self.until = now + READMIT_WINDOW_S
        self._forgotten.clear()

    def offered_again(self, freed: Sequence[Holding]) -> None:
        """The kubelet offers these containers' devices again: within the window, it forgot them."""
        if time.monotonic() < self.until:
            self._forgotten.update((h.key.pod_uid, h.key.container) for h in freed if h.key is not None)

    def forgotten(self) -> set[tuple[str, str]]:
        """Containers recorded on their pod whose devices the restarted kubelet offered again (empty once
        READMIT_WINDOW_S has passed since its restart)."""
        if self._forgotten and time.monotonic() >= self.until:
            self._forgotten.clear()
        return self._forgotten
