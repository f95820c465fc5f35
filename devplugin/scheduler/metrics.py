"""Prometheus metrics of the scheduler service (extender and webhooks), served at /metrics on its HTTP app.

Requests are counted and timed as they are answered; the cluster as the extender sees it (room per node and GPU,
assumptions outstanding) is read from ClusterState at scrape time. Every metric lives in the service's own
CollectorRegistry, so several apps can run in one process (tests).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from devplugin.contract import CORE_PER_GPU
from devplugin.scheduler.fit import MODES_WITH_CORE
from devplugin.scheduler.state import ClusterState

PREFIX = "gpushare_"
VERBS = ("filter", "prioritize", "preempt", "bind")
WEBHOOKS = ("validate", "mutate")
BIND_OUTCOMES = ("bound", "failed", "no_apiserver", "error")
FILTER_RESULTS = ("passed", "failed", "unresolvable")
REFUSALS = ("busy", "too_large", "slow_body", "malformed")
# kube-scheduler waits up to its extender timeout (5 s by default) for an answer; most take well under 10 ms.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class SchedulerMetrics:
    """The service's registry, what the HTTP layer tells it, and the collector over the cluster state."""

    def __init__(self, state: ClusterState) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.extender_latency = Histogram(
            PREFIX + "extender_duration_seconds", "Time to answer one kube-scheduler extender call, by verb",
            ["verb"], buckets=BUCKETS, registry=self.registry)
        self.binds = Counter(
            PREFIX + "extender_binds", "Bind calls by outcome: bound, failed (the pod no longer fits, or the "
            "apiserver refused the Binding), no_apiserver, error (a bug: HTTP 500)", ["outcome"],
            registry=self.registry)
        self.filtered = Counter(
            PREFIX + "extender_filter_nodes", "Nodes judged by filter calls, by result: passed, failed (no room "
            "now), unresolvable (freeing room would not help)", ["result"], registry=self.registry)
        self.webhook_latency = Histogram(
            PREFIX + "webhook_duration_seconds", "Time to answer one admission review, by webhook",
            ["webhook"], buckets=BUCKETS, registry=self.registry)
        self.denials = Counter(
            PREFIX + "webhook_denials", "Pods the validating webhook denied, by rule broken (a pod breaking "
            "several rules counts once under each)", ["rule"], registry=self.registry)
        self.reviews = Counter(
            PREFIX + "webhook_reviews", "Admission reviews by webhook and result: allowed, denied, patched",
            ["webhook", "result"], registry=self.registry)
        self.refusals = Counter(
            PREFIX + "webhook_refused", "Admission posts answered with an error before any verdict, by reason: busy "
            "(no review slot freed in time: 429), too_large (over --max-body-bytes or --max-review-tokens: 413), "
            "slow_body (the body did not arrive in time: 408), malformed (400)", ["reason"], registry=self.registry)
        for verb in VERBS:
            self.extender_latency.labels(verb)
        for outcome in BIND_OUTCOMES:
            self.binds.labels(outcome)
        for result in FILTER_RESULTS:
            self.filtered.labels(result)
        for hook in WEBHOOKS:
            self.webhook_latency.labels(hook)
        for reason in REFUSALS:
            self.refusals.labels(reason)
        self.registry.register(StateCollector(state))

    def answered(self, path: str, seconds: float) -> None:
        """One request answered (whatever its status): timed by the verb or webhook its path names."""
        head, _, last = path.rstrip("/").rpartition("/")
        if last in VERBS and head.endswith("/scheduler"):
            self.extender_latency.labels(last).observe(seconds)
        elif last in WEBHOOKS and head.endswith("/admission"):
            self.webhook_latency.labels(last).observe(seconds)

    def bind(self, outcome: str) -> None:
        self.binds.labels(outcome).inc()

    def filter(self, passed: int, failed: int, unresolvable: int) -> None:
        for result, n in zip(FILTER_RESULTS, (passed, failed, unresolvable), strict=True):
            if n:
                self.filtered.labels(result).inc(n)

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def review(self, webhook: str, result: str, rules: tuple[str, ...] = ()) -> None:
        self.reviews.labels(webhook, result).inc()
        for rule in rules:
            self.denials.labels(rule).inc()


class StateCollector(Collector):
    """Per node and GPU room, and assumptions outstanding, as the extender counts them now."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def describe(self) -> Iterator[Metric]:
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        fams = _families()
        mem_used, mem_cap, core_used, core_cap, containers, whole, healthy, usable, assumed = fams
        state = self.state
        for name, view in state.views(state.node_names()):
            if view is None:
                continue
            usable.add_metric([name], 0 if view.problem else 1)
            serves_core = view.mode in MODES_WITH_CORE
            for g in view.gpus:
                labels = [name, str(g.index), g.uuid]
                mem_used.add_metric(labels, g.mem_allocated)
                mem_cap.add_metric(labels, g.mem_total)
                core_used.add_metric(labels, g.core_allocated)
                core_cap.add_metric(labels, CORE_PER_GPU if serves_core else 0)
                containers.add_metric(labels, g.containers)
                whole.add_metric(labels, 1 if g.whole else 0)
                healthy.add_metric(labels, 1 if g.healthy else 0)
        assumed.add_metric([], state.assumptions())
        return iter(fams)


def _families() -> list[GaugeMetricFamily]:
    g = ["node", "gpu", "uuid"]
    p = PREFIX + "extender_"
    return [
        GaugeMetricFamily(p + "gpu_memory_allocated_units", "gpu-mem units held on the GPU as the extender counts "
                          "them (pods' annotations, assumptions, and at least the node's reported use)", labels=g),
        GaugeMetricFamily(p + "gpu_memory_capacity_units", "gpu-mem units of the GPU (the node's inventory)",
                          labels=g),
        GaugeMetricFamily(p + "gpu_core_allocated_percent", "gpu-core.percentage held on the GPU (whole: 100)",
                          labels=g),
        GaugeMetricFamily(p + "gpu_core_capacity_percent", "gpu-core.percentage the GPU offers (0 where the node's "
                          "mode serves no compute shares)", labels=g),
        GaugeMetricFamily(p + "gpu_containers", "Containers holding a share of the GPU", labels=g),
        GaugeMetricFamily(p + "gpu_whole_held", "1 while the GPU is held whole", labels=g),
        GaugeMetricFamily(p + "gpu_healthy", "1 when the node's inventory says the GPU is healthy", labels=g),
        GaugeMetricFamily(p + "node_usable", "1 when the node can take GPU pods (inventory published, mode served)",
                          labels=["node"]),
        GaugeMetricFamily(p + "assumptions", "GPU choices made by bind that the pod watch has not confirmed yet"),
    ]
