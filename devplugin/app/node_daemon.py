"""The node daemon, assembled: GPUs, allocator, device-plugin servers, health, node sync and the cluster link.

`build()` makes every part for one node mode; `NodeDaemon.start()` / `stop()` run them. The cluster link (pod
cache, node watch, writer) lives longer than one NodeDaemon: a relabel rebuilds the daemon but keeps the link.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.node import Node
from devplugin.allocation.ports import MountProvider, Reporter
from devplugin.allocation.requests import PodRequest
from devplugin.allocation.units import check_message_size
from devplugin.app.admission_metrics import AdmissionMetrics
from devplugin.app.config import Config
from devplugin.deviceplugin import toolkit_config
from devplugin.deviceplugin.daemon import Daemon
from devplugin.deviceplugin.devices import DeviceBoard
from devplugin.gpu.device import GPU
from devplugin.gpu.health import HealthWatcher
from devplugin.gpu.health_state import HealthStore
from devplugin.gpu.layout_watch import LayoutChange, LayoutWatcher
from devplugin.kube.node_sync import SYNC_INTERVAL_ALONE_S, SYNC_INTERVAL_S, NodeSync
from devplugin.kube.reporting import ClusterReporter, occupancy

if TYPE_CHECKING:
    from devplugin.kube.node_watch import NodeWatch
    from devplugin.kube.pod_cache import PodCache
    from devplugin.kube.writer import KubeWriter

log = logging.getLogger(__name__)


@dataclass
class KubeLink:
    """The daemon's link to the apiserver: pod cache, node watch and the background writer (any may be absent)."""

    pods: PodCache | None = None
    node_watch: NodeWatch | None = None
    writer: KubeWriter | None = None  # patches and Events, off the admission path
    current: NodeDaemon | None = None  # the daemon serving now (a relabel replaces it)

    def __post_init__(self) -> None:
        if self.pods is not None:
            self.pods.add_listener(self._pod_changed)

    def _pod_changed(self, event: str, pod: PodRequest) -> None:
        if self.current is not None:
            self.current.pod_changed(event, pod)

    def pod_list(self) -> list[PodRequest] | None:
        """The cached pods, or None while there is no synced cache."""
        cache = self.pods
        if cache is None or not cache.synced.is_set():
            return None
        return cache.pods()


class CacheLookup:
    """PodLookup over the pod cache: no view (None) until its first LIST."""

    def __init__(self, link: KubeLink) -> None:
        self.link = link

    def pods(self) -> list[PodRequest] | None:
        return self.link.pod_list()

    def fetch_now(self, budget_s: float) -> list[PodRequest] | None:
        return self.link.pods.fetch_now(budget_s) if self.link.pods is not None else None


@dataclass
class NodeDaemon:
    """Everything that serves one node in one mode."""

    cfg: Config
    node: Node
    board: DeviceBoard
    allocator: Allocator
    daemon: Daemon
    health: HealthWatcher
    sync: NodeSync
    link: KubeLink = field(default_factory=KubeLink)
    reporter: ClusterReporter | None = None
    layout: LayoutWatcher | None = None
    # Served devices whose GPU's MIG layout changed or waits for a reset (gpu/layout_watch.py): device UUID -> the
    # served layout is gone (True) or only a reset is pending (False). They stay Unhealthy while this daemon runs.
    stale: dict[str, bool] = field(default_factory=dict)
    on_stale: Callable[[], object] = lambda: None  # the supervisor's wake-up

    def start(self) -> None:
        self.link.current = self
        if self.reporter is not None:
            self.reporter.start()
            self.reporter.publish_inventory(self.board.is_healthy)
        self.daemon.start()
        self.health.start()
        if self.layout is not None:
            self.layout.start()
        self.sync.start()

    def stop(self) -> None:
        if self.layout is not None:
            self.layout.stop()
        self.sync.stop()
        self.health.stop()
        self.daemon.stop()
        if self.reporter is not None:
            self.reporter.stop()

    def ready(self) -> tuple[bool, str]:
        """Ready once the node's held devices are known and every resource is registered with the kubelet."""
        if not self.daemon.state_known.is_set():
            return False, "waiting for the kubelet's PodResources API (the node's held devices are not known yet)"
        missing = [k.value for k in self.node.kinds if not self.daemon.registered(k)]
        if missing:
            return False, f"not registered with the kubelet yet: {', '.join(missing)}"
        return True, "ok"

    def alive(self) -> tuple[bool, str]:
        """For the liveness probe: every worker thread this daemon started is still running."""
        for part in (self.daemon, self.sync):
            ok, why = part.alive()
            if not ok:
                return ok, why
        return True, "ok"

    def drained(self) -> bool:
        """Whether a changed MIG layout can be served now: some served device's layout is gone and no container
        holds any such device."""
        gone = [u for u, differs in self.stale.items() if differs]
        return bool(gone) and self.allocator.snapshot(lambda h: all(h.containers_on(u) == 0 for u in gone))

    def layout_changed(self, change: LayoutChange) -> None:
        """The layout watcher's report: the GPU's served devices turn Unhealthy (kept so), an Event on the Node."""
        for uuid in change.affected:
            self.stale[uuid] = self.stale.get(uuid, False) or change.differs
            if self.board.set_health(uuid, False, change.reason) and self.reporter is not None:
                self.reporter.publish_inventory(self.board.is_healthy)
        if self.link.writer is not None and self.cfg.node_name:
            self.link.writer.node_event(self.cfg.node_name, "Warning", "GPUMigLayoutChanged", change.reason)
        self.on_stale()

    def pod_changed(self, event: str, pod: PodRequest) -> None:
        """Pod cache listener: units of pods that ended come back at once."""
        if event == "DELETED" or pod.finished:
            self.allocator.pod_ended(pod.uid)
            if self.reporter is not None:
                self.reporter.forget_pod(pod.uid)


def build(cfg: Config, gpus: list[GPU], mode: str, placement: str, mounts: MountProvider | None = None,
          link: KubeLink | None = None, metrics: AdmissionMetrics | None = None, whole_gpus: int = 0) -> NodeDaemon:
    """All parts for this node; ValueError / UnitTooFine on settings that cannot be served. `metrics` hears
    every admission call and pod lookup; `whole_gpus`: the last N GPUs are kept for gpu-count (node label
    gpushare.io/whole-gpus)."""
    unit = cfg.unit()
    check_message_size(gpus, unit)
    node = Node(gpus=tuple(gpus), mode=mode, placement=placement, unit=unit, domain=cfg.resource_domain,
                whole_gpus=whole_gpus)
    for gpu in gpus:
        log.info("GPU %d: %s, %d MiB, %s", gpu.index, gpu.name, gpu.memory_bytes >> 20, gpu.uuid,
                 extra={"fields": {"gpu": gpu.uuid, "gpu_index": gpu.index, "numa": gpu.numa_node}})
    link = link or KubeLink()
    board = DeviceBoard(node)
    reporter: ClusterReporter | None = None
    if link.writer is not None and cfg.node_name:
        reporter = ClusterReporter(node, cfg.node_name, link.writer, board.set_occupancy)
    allocator = Allocator(node, pair_window_s=cfg.pair_window, mounts=mounts,
                          lookup=CacheLookup(link) if link.pods is not None else None,
                          reporter=reporter or _BoardOnly(node, board), lookup_budget_s=cfg.lookup_budget,
                          lookup_patience_s=cfg.lookup_patience,
                          healthy=board.is_healthy)
    # Without the pod cache, PodResources is the only news of pods that ended (the kubelet refuses on its own view
    # of whole GPUs before calling us): read it often; it is a local call of about a millisecond.
    sync = NodeSync(allocator, cfg.pod_resources_socket, link.pod_list,
                    interval_s=SYNC_INTERVAL_S if link.pods is not None else SYNC_INTERVAL_ALONE_S)
    allocator.resync = sync.sync
    allocator.refresh = sync.refresh
    allocator.on_guess = sync.poke_soon
    allocator.read_kubelet = sync.sync_listing
    allocator.read_pods = sync.read_pods
    if reporter is not None:
        reporter.snapshot = allocator.snapshot
    if metrics is not None:
        allocator.on_lookup = metrics.lookup
        metrics.prepare([node.resource_name(k) for k in node.kinds])
    choice = toolkit_config.choose(cfg.device_list_strategy, toolkit_config.read(cfg.toolkit_config))
    log.info("device-list strategy %s", choice.strategy, extra={"fields": {
        "requested": cfg.device_list_strategy, "toolkit_config": cfg.toolkit_config}})
    for warning in choice.warnings:
        log.warning("%s", warning, extra={"fields": {"toolkit_config": cfg.toolkit_config}})
    daemon = Daemon(node, Path(cfg.plugin_dir), allocator, board, sync=sync.sync, observer=metrics,
                    device_list_strategy=choice.strategy)

    stale: dict[str, bool] = {}

    def health_changed(uuid: str, healthy: bool, reason: str) -> bool:
        if healthy and uuid in stale:  # its MIG layout changed: it stays Unhealthy while this daemon runs
            return False
        changed = board.set_health(uuid, healthy, reason)
        if changed and reporter is not None:
            reporter.publish_inventory(board.is_healthy)
        return changed

    health = HealthWatcher(
        gpus, on_change=health_changed, ignored_xids=cfg.ignored_xid_set(), recovery_seconds=cfg.recovery_seconds,
        reset_xids=cfg.reset_xid_set(), store=HealthStore(Path(cfg.state_dir)),
    )
    nd = NodeDaemon(cfg, node, board, allocator, daemon, health, sync, link, reporter, stale=stale)
    nd.layout = LayoutWatcher(gpus, nd.layout_changed, cfg.mig_check_interval)
    return nd


class _BoardOnly(Reporter):
    """Without an apiserver: still keep the kubelet's view of whole GPUs honest."""

    def __init__(self, node: Node, board: DeviceBoard) -> None:
        self.node = node
        self.board = board

    def occupancy_changed(self, holdings: Holdings) -> None:
        self.board.set_occupancy(occupancy(holdings, self.node))
