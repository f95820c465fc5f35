"""Prometheus metrics of the DRA plugin: prepare / unprepare counts and latency, prepared claims."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class DraMetrics:
    def __init__(self, node: str, prepared: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("gpushare_dra_claim_operations", "claims prepared or unprepared, by result",
                             ["node", "operation", "result"], registry=self.registry)
        self.seconds = Histogram("gpushare_dra_claim_operation_seconds", "time to prepare or unprepare one claim",
                                 ["node", "operation"], buckets=BUCKETS, registry=self.registry)
        gauge = Gauge("gpushare_dra_prepared_claims", "claims prepared on this node", ["node"],
                      registry=self.registry)
        gauge.labels(node).set_function(lambda: float(prepared()))
        self.node = node

    def observe(self, operation: str, seconds: float, ok: bool) -> None:
        self.calls.labels(self.node, operation, "ok" if ok else "error").inc()
        self.seconds.labels(self.node, operation).observe(seconds)
