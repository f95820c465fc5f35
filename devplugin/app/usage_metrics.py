"""Per-container GPU use for /metrics: each container holding devices of this node, per GPU, read at scrape time
from the shim's usage file of that container (devplugin/isolation/container_usage.py).

Series exist only for containers the daemon knows as holding devices: one that ended disappears at the next
scrape after the daemon learns it ended. Labels: node, namespace, pod, container, gpu (index), uuid; at most a
few hundred containers a node, each on 1..16 GPUs (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from devplugin.isolation.container_usage import ContainerGpuUse, container_use
from devplugin.isolation.shim_files import ShimPaths

if TYPE_CHECKING:
    from devplugin.app.node_daemon import KubeLink, NodeDaemon

log = logging.getLogger(__name__)

PREFIX = "gpushare_container_"
LABELS = ["node", "namespace", "pod", "container", "gpu", "uuid"]


class _Families:
    def __init__(self) -> None:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=LABELS)

        self.mem_used = gauge("memory_used_bytes", "GPU memory the container's live processes hold (the shim's "
                              "accounting), in bytes")
        self.mem_limit = gauge("memory_limit_bytes", "GPU memory the container was given, in bytes (a GPU held "
                               "whole: all of it)")
        self.compute_used = gauge("compute_used_percent", "Percent of the GPU's time the container's launches took "
                                  "over the shim's last measurement (about 100 ms); only for containers with a "
                                  "compute share below 100")
        self.share = gauge("compute_share_percent", "Percent of the GPU's compute the container was given (100: no "
                           "compute limit)")
        self.refused = CounterMetricFamily(PREFIX + "memory_refusals", "Allocations refused because the "
                                           "container was at its memory cap", labels=LABELS)
        self.throttled = CounterMetricFamily(PREFIX + "throttled_seconds", "Time the container's launches waited "
                                             "for its compute share, summed over its threads", labels=LABELS)
        self.processes = gauge("processes", "Processes of the container registered in its usage file (CUDA users)")
        self.unreadable = GaugeMetricFamily(
            PREFIX + "usage_unreadable", "1 when the container's usage file cannot be read (the reason says why; "
            "its figures then show 0)", labels=LABELS + ["reason"])

    def all(self) -> list[Metric]:
        return [self.mem_used, self.mem_limit, self.compute_used, self.share, self.refused, self.throttled,
                self.processes, self.unreadable]


def add_rows(f: _Families, node_name: str, rows: list[ContainerGpuUse]) -> None:
    for r in rows:
        labels = [node_name, r.namespace, r.pod, r.container, str(r.gpu), r.uuid]
        f.mem_used.add_metric(labels, r.memory_used)
        f.mem_limit.add_metric(labels, r.memory_limit)
        if r.compute_used is not None:
            f.compute_used.add_metric(labels, r.compute_used)
        f.share.add_metric(labels, r.compute_share)
        f.refused.add_metric(labels, r.refused)
        f.throttled.add_metric(labels, r.throttled_s)
        f.processes.add_metric(labels, r.processes)
        if r.error:
            f.unreadable.add_metric(labels + [r.error], 1)


def current_use(nd: NodeDaemon, paths: ShimPaths) -> list[ContainerGpuUse]:
    """The figures of every container the serving daemon holds devices for ([] when it delivers no shim)."""
    if nd.allocator.mounts is None:
        return []
    return container_use(nd.node, nd.allocator.holdings.holders(), paths)


class ContainerUseCollector(Collector):
    """Per-container use of the daemon serving now, read at scrape time."""

    def __init__(self, link: Callable[[], KubeLink | None], node_name: str) -> None:
        self.link = link
        self.node_name = node_name

    def describe(self) -> Iterator[Metric]:
        return iter(_Families().all())

    def collect(self) -> Iterator[Metric]:
        f = _Families()
        link = self.link()
        nd = link.current if link is not None else None
        if nd is not None:
            try:
                add_rows(f, self.node_name, current_use(nd, ShimPaths(host_root=Path(nd.cfg.shim_state_dir))))
            except (OSError, ValueError) as exc:  # the node's figures must not fail the scrape
                log.warning("reading per-container GPU use failed: %s", exc, extra={"fields": {"node": self.node_name}})
        return iter(f.all())
