"""The node daemon's admission figures, counted as they happen: how long each kubelet admission call took, the
refusals, and how each admitted container was named (pod lookups). Told by the device-plugin servicers
(AdmissionObserver) and the allocator (`lookup`); nothing else on the admission path. They live in the registry
the daemon's /metrics serves (devplugin/app/metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from devplugin.allocation.errors import RequestError
from devplugin.allocation.ports import LOOKUP_OUTCOMES

PREFIX = "gpushare_"
CALLS = ("GetPreferredAllocation", "Allocate")
# Admission answers take tens of microseconds from the cache and up to the lookup budget (0.3 s by default) when
# the apiserver must be asked: buckets cover both ends.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class AdmissionMetrics:
    """AdmissionObserver for the servicers and `lookup` for the allocator, in `registry`."""

    def __init__(self, registry: CollectorRegistry, node_name: str = "") -> None:
        self.node_name = node_name
        self.latency = Histogram(
            PREFIX + "admission_duration_seconds",
            "Time to answer one kubelet admission call (GetPreferredAllocation or Allocate), refusals included",
            ["node", "call", "resource"], buckets=LATENCY_BUCKETS, registry=registry)
        self.refusals = Counter(
            PREFIX + "admission_refusals",
            "Admission calls refused; error: invalid_request, no_room or conflict; reason: a short code",
            ["node", "call", "resource", "error", "reason"], registry=registry)
        self.lookups = Counter(
            PREFIX + "pod_lookups",
            "How the daemon named the container being admitted: cache, direct (a LIST within the lookup budget), "
            "not_found or no_answer (both placed by node-local pairing)",
            ["node", "outcome"], registry=registry)
        self._lookup = {o: self.lookups.labels(node_name, o) for o in LOOKUP_OUTCOMES}
        self._timers: dict[tuple[str, str], Histogram] = {}  # (call, resource) -> its series, looked up once

    # ------------------------------------------------------------------ AdmissionObserver
    def answered(self, call: str, resource: str, seconds: float) -> None:
        timer = self._timers.get((call, resource))
        if timer is None:
            timer = self._timers[(call, resource)] = self.latency.labels(self.node_name, call, resource)
        timer.observe(seconds)

    def refused(self, call: str, resource: str, exc: RequestError) -> None:
        self.refusals.labels(self.node_name, call, resource, exc.error, exc.reason).inc()

    # ------------------------------------------------------------------ Allocator.on_lookup
    def lookup(self, outcome: str) -> None:
        child = self._lookup.get(outcome)
        if child is not None:
            child.inc()

    def prepare(self, resources: list[str]) -> None:
        """Create the admission series of these resources at zero, so that rates exist before the first call."""
        for res in resources:
            for call in CALLS:
                self._timers[(call, res)] = self.latency.labels(self.node_name, call, res)
