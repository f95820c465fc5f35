"""`devplugin serve`: connect to the cluster, learn the node's mode, serve it until SIGTERM; follow relabels.

The apiserver is asked through a watch of this node (labels) and of its pods (identity); while it cannot be
reached, `--mode` / `--placement` serve when given, otherwise the daemon waits, not ready, and keeps trying. A
change of `ack.node.gpu.schedule` or `ack.node.gpu.placement` is applied (resources re-registered) as soon as no
container holds GPU units; until then it is logged and reported as a Warning Event on the Node.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from devplugin.allocation.node import MODES
from devplugin.allocation.ports import MountProvider
from devplugin.allocation.units import Kind, UnitTooFine
from devplugin.app.config import Config
from devplugin.app.endpoints import start_endpoints, stop_endpoints
from devplugin.app.metrics import NodeMetrics
from devplugin.app.node_daemon import KubeLink, NodeDaemon, build
from devplugin.contract import ALLOCATION_DRA, LABEL_ALLOCATION, LABEL_MODE, LABEL_PLACEMENT
from devplugin.deviceplugin import toolkit_config
from devplugin.gpu.device import GPU
from devplugin.gpu.inventory import NvmlUnavailable, enumerate_gpus
from devplugin.isolation.shim_delivery import Janitor, shim_provider
from devplugin.isolation.shim_files import ShimPaths
from devplugin.kube.labels import NodeSettings, mode_from_labels, whole_gpus_from_labels

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
RELABEL_CHECK_S = 1.0
TENANT_FIGURES = "per-container metrics (namespace, pod and container names)"


def connect(cfg: Config, on_labels: Callable[[dict[str, str]], None] | None = None,
            on_recreated: Callable[[], None] = lambda: None) -> KubeLink:
    """The cluster link: pod cache, node watch and writer; an empty link (node-local only) when the apiserver
    cannot be configured."""
    if not cfg.node_name:
        log.warning("no node name (set NODE_NAME from the downward API, spec.nodeName): no pod identity, no "
                    "annotations or Events; containers are placed by node-local pairing")
        return KubeLink()
    from devplugin.kube.client import KubeConfigError, load_api_client
    from devplugin.kube.node_watch import NodeWatch
    from devplugin.kube.pod_cache import PodCache
    from devplugin.kube.writer import KubeWriter

    try:
        api = load_api_client(cfg.kubeconfig)
    except KubeConfigError as exc:
        log.warning("%s: no pod identity, annotations or Events; containers are placed by node-local pairing", exc,
                    extra={"fields": {"node": cfg.node_name}})
        return KubeLink()
    pods = PodCache(api, cfg.node_name, cfg.resource_domain).start()
    writer = KubeWriter(api, cfg.node_name).start()
    watch = NodeWatch(api, cfg.node_name, on_labels or (lambda labels: None), on_recreated=on_recreated).start()
    return KubeLink(pods=pods, node_watch=watch, writer=writer)


def settings_from(labels: dict[str, str] | None, cfg: Config, gpus: int = 0) -> NodeSettings | None:
    """The node's mode and placement (and GPUs kept for gpu-count, of `gpus`): its labels when they are known,
    else the flags; None when neither says."""
    if labels is not None:
        if labels.get(LABEL_ALLOCATION) == ALLOCATION_DRA:
            return NodeSettings(ALLOCATION_DRA, labels.get(LABEL_PLACEMENT, cfg.placement),
                                f"node label {LABEL_ALLOCATION}={ALLOCATION_DRA}")
        mode = mode_from_labels(labels)
        placement = labels.get(LABEL_PLACEMENT, cfg.placement)
        whole, problem = whole_gpus_from_labels(labels, gpus)
        if mode is not None:
            return NodeSettings(mode, placement, f"node label {LABEL_MODE}={mode}", whole, problem)
        if cfg.mode:
            return NodeSettings(cfg.mode, placement, f"flag --mode (node has no {LABEL_MODE} label)", whole, problem)
        return NodeSettings("", placement, f"node has no {LABEL_MODE} label and no --mode was given")
    if cfg.mode:
        return NodeSettings(cfg.mode, cfg.placement, "flag --mode (apiserver not reachable)")
    return None


class Supervisor:
    """Runs one NodeDaemon at a time; rebuilds it when the node's labels change and no container holds units."""

    def __init__(self, cfg: Config, gpus: list[GPU], mounts: MountProvider | None) -> None:
        self.cfg = cfg
        self.gpus = gpus
        self.mounts = mounts
        self.metrics = NodeMetrics(lambda: self.link, cfg.node_name)
        self.stop_event = threading.Event()
        self.changed = threading.Event()
        self.link = KubeLink()
        self.current: NodeDaemon | None = None
        self.settings: NodeSettings | None = None
        self.wanted: NodeSettings | None = None
        self.waiting_why = "starting"

    def on_labels(self, labels: dict[str, str]) -> None:
        if self.settings is None:  # the first read: _initial_settings takes it from the watch
            return
        wanted = settings_from(labels, self.cfg, len(self.gpus))
        if wanted is None or (wanted.mode, wanted.placement, wanted.whole_gpus) == (
                self.settings.mode, self.settings.placement, self.settings.whole_gpus):
            self.wanted = None
            return
        self.wanted = wanted
        if self.current is not None and self.link.writer is not None:
            held = len(self.current.allocator.holdings.holders())
            msg = (f"GPU mode/placement changed to {wanted.mode or '(none)'}/{wanted.placement} (was "
                   f"{self.settings.mode}/{self.settings.placement}); " +
                   (f"applied once the {held} container(s) holding GPU units end" if held else "applying now"))
            log.warning("%s", msg, extra={"fields": {"node": self.cfg.node_name}})
            self.link.writer.node_event(self.cfg.node_name, "Warning", "GPUModeChange", msg)
        self.changed.set()

    def on_recreated(self) -> None:
        """The Node object was deleted and created again: put the GPU inventory and usage back on it."""
        current = self.current
        if current is not None and current.reporter is not None:
            current.reporter.republish(current.board.is_healthy)

    def ready(self) -> tuple[bool, str]:
        if self.current is None:
            return False, self.waiting_why
        return self.current.ready()

    def alive(self) -> tuple[bool, str]:
        current = self.current
        return (True, "ok") if current is None else current.alive()

    def run(self) -> int:
        self.link = connect(self.cfg, self.on_labels, self.on_recreated)
        self.settings = self._initial_settings()
        janitor = None
        while not self.stop_event.is_set() and self.settings is not None:
            if self.settings.mode == ALLOCATION_DRA:
                self.waiting_why = (f"node is labelled {LABEL_ALLOCATION}={ALLOCATION_DRA}: its GPUs are served "
                                    "through DRA by `devplugin dra`, so the device plugin registers no resource "
                                    "(remove the label to serve them here)")
                log.error("%s; serving nothing until the label changes", self.waiting_why,
                          extra={"fields": {"node": self.cfg.node_name}})
                self._wait_for_change(None)
                continue
            if self.settings.mode not in MODES:
                self.waiting_why = (f"node mode {self.settings.mode!r} ({self.settings.source}) is not served: label "
                                    "the node ack.node.gpu.schedule=core_mem|cgpu|share")
                log.error("%s; serving nothing until the label changes", self.waiting_why,
                          extra={"fields": {"node": self.cfg.node_name}})
                self._wait_for_change(None)
                continue
            try:
                if self.settings.problem:
                    log.warning("%s", self.settings.problem, extra={"fields": {"node": self.cfg.node_name}})
                self.current = build(self.cfg, self.gpus, self.settings.mode, self.settings.placement, self.mounts,
                                     self.link, self.metrics.admission, self.settings.whole_gpus)
            except (UnitTooFine, ValueError) as exc:
                log.error("cannot serve: %s", exc)
                return EXIT_CONFIG
            log.info("node %s: %d GPUs, mode %s (%s), placement %s", self.cfg.node_name or "?", len(self.gpus),
                     self.settings.mode, self.settings.source, self.settings.placement,
                     extra={"fields": {"node": self.cfg.node_name, "mode": self.settings.mode}})
            try:
                self.current.start()
            except NvmlUnavailable as exc:
                log.error("cannot watch GPU health: %s", exc)
                self.current.stop()
                return EXIT_CONFIG
            self.current.on_stale = self.changed.set
            if janitor is None:
                janitor = start_janitor(self.cfg, self.current)
            self._wait_for_change(self.current)
            self.current.stop()
            self.current = None
        if janitor is not None:
            janitor.stop()
        for part in (self.link.node_watch, self.link.pods, self.link.writer):
            if part is not None:
                part.stop()
        return 0

    def _initial_settings(self) -> NodeSettings | None:
        """Labels when the node watch answers within --apiserver-timeout; else the flags; else wait (not ready)."""
        watch = self.link.node_watch
        delay = self.cfg.apiserver_timeout
        while not self.stop_event.is_set():
            if watch is not None and watch.synced.wait(delay):
                return settings_from(watch.labels(), self.cfg, len(self.gpus))
            fallback = settings_from(None, self.cfg)
            if fallback is not None:
                log.warning("node labels could not be read within %.1f s: using --mode %s and --placement %s until "
                            "they can", delay, self.cfg.mode, self.cfg.placement,
                            extra={"fields": {"node": self.cfg.node_name}})
                return fallback
            self.waiting_why = ("waiting for the apiserver to read the node's labels (set NODE_NAME and RBAC, or "
                                "pass --mode)")
            log.warning("%s", self.waiting_why, extra={"fields": {"node": self.cfg.node_name}})
            if watch is None:
                self.stop_event.wait()
                return None
            delay = min(delay * 2, 30.0)
        return None

    def _wait_for_change(self, current: NodeDaemon | None) -> None:
        """Until SIGTERM, a wanted relabel that can be applied (no container holds units), or a changed MIG layout
        that can be served (no container holds a device that is gone)."""
        while not self.stop_event.is_set():
            self.changed.wait(RELABEL_CHECK_S)
            self.changed.clear()
            if current is not None and current.drained() and self._read_layout_again():
                return
            wanted = self.wanted
            if wanted is None:
                continue
            if current is not None and current.allocator.holdings.holders():
                continue
            log.warning("applying node mode %s, placement %s (%s)", wanted.mode or "(none)", wanted.placement,
                        wanted.source, extra={"fields": {"node": self.cfg.node_name}})
            self.settings, self.wanted = wanted, None
            return


    def _read_layout_again(self) -> bool:
        """The node's GPUs and MIG devices read again, to serve the changed layout; False when NVML cannot say."""
        try:
            gpus = enumerate_gpus()
        except NvmlUnavailable as exc:
            log.warning("the changed MIG layout cannot be read yet: %s", exc,
                        extra={"fields": {"node": self.cfg.node_name}})
            return False
        log.warning("serving the node's new MIG layout: %d GPUs and MIG devices (was %d)", len(gpus), len(self.gpus),
                    extra={"fields": {"node": self.cfg.node_name}})
        self.gpus = gpus
        return True


def run(cfg: Config) -> int:
    """Serve until SIGTERM or SIGINT; exit code 0 on a clean stop, 2 on a configuration error."""
    try:
        toolkit_config.choose(cfg.device_list_strategy, toolkit_config.read(cfg.toolkit_config))  # refused now
        gpus = enumerate_gpus()
        mounts = shim_mounts(cfg)
    except (NvmlUnavailable, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_CONFIG
    sup = Supervisor(cfg, gpus, mounts)

    def stop(*_: object) -> None:
        sup.stop_event.set()
        sup.changed.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    try:
        servers = start_endpoints(cfg, sup.ready, sup.alive, sup.metrics.exposition, TENANT_FIGURES)
    except (OSError, RuntimeError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_CONFIG
    try:
        return sup.run()
    finally:
        log.info("stopped")
        stop_endpoints(servers)


def shim_paths(cfg: Config) -> ShimPaths:
    return ShimPaths(host_root=Path(cfg.shim_state_dir), host_lib=Path(cfg.shim_lib))


def shim_mounts(cfg: Config) -> MountProvider | None:
    """The mount provider that delivers the isolation shim, per --shim; ValueError when --shim on cannot hold."""
    if cfg.shim == "off":
        return None
    paths = shim_paths(cfg)
    if not paths.host_lib.is_file():
        if cfg.shim == "on":
            raise ValueError(f"--shim on but the shim library {paths.host_lib} does not exist: install it (the "
                             "DaemonSet's init container copies it) or set --shim-lib")
        log.warning("shim library %s not found: shared containers get their limits as env only, without "
                    "enforcement (set --shim on to refuse to start instead)", paths.host_lib)
        return None
    return shim_provider(paths)


def start_janitor(cfg: Config, nd: NodeDaemon) -> Janitor | None:
    """Clean up shim files of ended containers (at start, then every 10 minutes). It asks about every resource of
    the domain, not only those of the current mode: it outlives relabels, and a container of a resource it did not
    ask about would look ended."""
    if nd.allocator.mounts is None:
        return None
    janitor = Janitor(shim_paths(cfg), cfg.pod_resources_socket, {nd.node.resource_name(k): k for k in Kind})
    janitor.start()
    return janitor
