"""What the allocator remembers between calls about the containers it admits: the one being admitted now, those
refused a moment ago, and the GPUs planned for a pod's later app containers. State only; the steps of the
allocation pipeline (allocator.py) read and change it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from devplugin.allocation.decision import Decision
from devplugin.allocation.holdings import Holdings

REFUSED_TTL_S = 300.0  # a refused container is not matched again while its pod still looks pending


@dataclass
class Admissions:
    latest: Decision | None = None  # the known container being admitted now
    refused: dict[tuple[str, str], float] = field(default_factory=dict)  # (pod UID, container) -> when
    plans: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)  # pod UID -> later container -> GPUs

    def refuse(self, pod_uid: str, container: str) -> None:
        self.refused[(pod_uid, container)] = time.monotonic()

    def taken(self, holdings: Holdings) -> set[tuple[str, str]]:
        """(pod UID, container) of every container placed, being admitted or refused lately: not pending."""
        now = time.monotonic()
        for k, t in list(self.refused.items()):
            if now - t > REFUSED_TTL_S:
                del self.refused[k]
        taken = {(h.key.pod_uid, h.key.container) for h in holdings.holders() if h.key is not None}
        taken.update(self.refused)
        if self.latest is not None and self.latest.key is not None:
            taken.add((self.latest.key.pod_uid, self.latest.key.container))
        return taken

    def pod_ended(self, pod_uid: str) -> None:
        self.plans.pop(pod_uid, None)
        if self.latest is not None and self.latest.key and self.latest.key.pod_uid == pod_uid:
            self.latest = None
