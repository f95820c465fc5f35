"""Prometheus metrics of the node daemon, served at /metrics on the metrics port (devplugin/app/metrics_server.py).

Two kinds of figures:
- events counted as they happen (admission latency, refusals, pod lookups): prometheus_client's Histogram and
  Counter (devplugin/app/admission_metrics.py), told by the servicer and the allocator; nothing else on the
  admission path;
- state read at scrape time by a Collector (per-GPU allocation and containers, health, registration, apiserver
  errors): it reads the serving daemon's node view without the allocator's lock (lengths of dicts and sets,
  which are atomic), so admissions pay nothing for it.

- per-container GPU use (devplugin/app/usage_metrics.py), read at scrape time from each held container's usage
  file and written out by its own renderer (container_exposition), appended to the registry's exposition.

Every metric lives in the daemon's own CollectorRegistry (not the process-global one), so several daemons can run
in one process (tests) and the exposition holds only this daemon's figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from devplugin.allocation.units import Kind
from devplugin.app import usage_metrics
from devplugin.app.admission_metrics import PREFIX, AdmissionMetrics
from devplugin.app.node_daemon import KubeLink, NodeDaemon

MIB = 1 << 20


class NodeMetrics:
    """The daemon's registry: the admission figures (`admission`, told by the servicers and the allocator) and the
    scrape-time collector over `link().current`, the daemon serving now. `link` is a callable: the cluster link is
    made after the metrics endpoint is up."""

    def __init__(self, link: Callable[[], KubeLink | None], node_name: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.node_name = node_name
        self.admission = AdmissionMetrics(self.registry, node_name)
        self.registry.register(NodeCollector(link, node_name))
        self._link = link

    def container_exposition(self) -> bytes:
        """The per-container families (usage_metrics.py), appended to the registry's on /metrics."""
        return usage_metrics.exposition(self._link, self.node_name)

    def exposition(self) -> bytes:
        """Everything /metrics answers: the registry's families, then the per-container ones."""
        return generate_latest(self.registry) + self.container_exposition()


class _Families:
    """The collector's metric families, filled per scrape."""

    def __init__(self) -> None:
        g = ["node", "gpu", "uuid"]

        def gauge(name: str, doc: str, labels: list[str] = g) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=labels)

        self.mem_used = gauge("gpu_memory_allocated_units",
                              "gpu-mem units held by containers (a GPU held whole counts all of its units)")
        self.mem_cap = gauge("gpu_memory_capacity_units", "gpu-mem units the GPU advertises")
        self.bytes_used = gauge("gpu_memory_allocated_bytes", "GPU memory held by containers, in bytes")
        self.bytes_cap = gauge("gpu_memory_capacity_bytes",
                               "GPU memory the GPU advertises (its gpu-mem units), in bytes")
        self.core_used = gauge("gpu_core_allocated_percent",
                               "gpu-core.percentage held by containers (a GPU held whole counts 100)")
        self.core_cap = gauge("gpu_core_capacity_percent",
                              "gpu-core.percentage the GPU advertises (0 where the node's mode does not serve it)")
        self.containers = gauge("gpu_containers", "Containers holding devices of this GPU")
        self.whole = gauge("gpu_whole_held", "1 while a gpu-count container holds the GPU whole")
        self.healthy = gauge("gpu_healthy", "1 when no critical XID holds the GPU down, else 0")
        self.unhealthy = gauge("gpu_unhealthy_info", "1 for each unhealthy GPU, with why", g + ["reason"])
        self.mig = gauge("gpu_mig_device_info", "1 for each MIG device served as a GPU of its own (its gpu and uuid "
                         "labels are those of the per-GPU families), with its GPU and profile",
                         g + ["parent_gpu", "parent_uuid", "profile"])
        self.registered = gauge("resource_registered", "1 when the resource is registered with the kubelet running now",
                                ["node", "resource"])
        self.info = gauge("node_info", "The mode this daemon serves", ["node", "mode", "placement", "mem_unit"])
        self.errors = CounterMetricFamily(
            PREFIX + "apiserver_errors", "Failed apiserver requests by operation: pod_watch, pod_fetch (direct LISTs "
            "that failed or missed their budget), node_watch, write (annotations and Events)",
            labels=["node", "operation"])

    def all(self) -> list[Metric]:
        return [self.mem_used, self.mem_cap, self.bytes_used, self.bytes_cap, self.core_used, self.core_cap,
                self.containers, self.whole, self.healthy, self.unhealthy, self.mig, self.registered, self.info,
                self.errors]


class NodeCollector(Collector):
    """Per-GPU and per-resource state of the daemon serving now, read at scrape time."""

    def __init__(self, link: Callable[[], KubeLink | None], node_name: str) -> None:
        self.link = link
        self.node_name = node_name

    def describe(self) -> Iterator[Metric]:
        return iter(_Families().all())

    def collect(self) -> Iterator[Metric]:
        f = _Families()
        link = self.link()
        if link is not None:
            if link.current is not None:
                self._fill(link.current, f)
            self._apiserver(link, f)
        return iter(f.all())

    def _fill(self, nd: NodeDaemon, f: _Families) -> None:
        node, holdings = nd.node, nd.allocator.holdings
        unit_bytes = node.unit.mib * MIB
        unhealthy = nd.board.unhealthy()
        serves_core = Kind.CORE in node.kinds
        for gpu in node.gpus:
            labels = [self.node_name, str(gpu.index), gpu.uuid]
            units = node.units(gpu.uuid, Kind.MEM)
            held_whole = holdings.whole(gpu.uuid)
            used = units if held_whole else holdings.used(Kind.MEM, gpu.uuid)
            core_total = node.units(gpu.uuid, Kind.CORE) if serves_core else 0
            core = core_total if held_whole else holdings.used(Kind.CORE, gpu.uuid)
            f.mem_used.add_metric(labels, used)
            f.mem_cap.add_metric(labels, units)
            f.bytes_used.add_metric(labels, used * unit_bytes)
            f.bytes_cap.add_metric(labels, units * unit_bytes)
            f.core_used.add_metric(labels, core)
            f.core_cap.add_metric(labels, core_total)
            f.containers.add_metric(labels, holdings.containers_on(gpu.uuid))
            f.whole.add_metric(labels, 1 if held_whole else 0)
            f.healthy.add_metric(labels, 0 if gpu.uuid in unhealthy else 1)
            if gpu.uuid in unhealthy:
                f.unhealthy.add_metric(labels + [unhealthy[gpu.uuid]], 1)
            if gpu.is_mig:
                parent = "" if gpu.parent_index is None else str(gpu.parent_index)
                f.mig.add_metric(labels + [parent, gpu.parent_uuid, gpu.mig_profile], 1)
        for kind in node.kinds:
            f.registered.add_metric([self.node_name, node.resource_name(kind)], 1 if nd.daemon.registered(kind) else 0)
        f.info.add_metric([self.node_name, node.mode, node.placement, node.unit.name], 1)

    def _apiserver(self, link: KubeLink, f: _Families) -> None:
        for part in (link.pods, link.node_watch, link.writer):
            counts = getattr(part, "apiserver_errors", None)
            if counts is None:
                continue
            for operation, n in counts().items():
                f.errors.add_metric([self.node_name, operation], n)
