"""Build the daemon from settings and run it until SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from devplugin.allocation.allocator import Allocator, MountProvider
from devplugin.allocation.node import MODES, Node
from devplugin.allocation.units import UnitTooFine, check_message_size
from devplugin.app.config import Config
from devplugin.deviceplugin.daemon import Daemon
from devplugin.deviceplugin.devices import DeviceBoard
from devplugin.gpu.health import HealthWatcher
from devplugin.gpu.health_state import HealthStore
from devplugin.gpu.inventory import NvmlUnavailable, enumerate_gpus
from devplugin.isolation.shim_delivery import Janitor, shim_provider
from devplugin.isolation.shim_files import ShimPaths
from devplugin.kube.labels import resolve

log = logging.getLogger(__name__)

EXIT_CONFIG = 2


def build(cfg: Config, mounts: MountProvider | None = None) -> tuple[Daemon, HealthWatcher] | None:
    """The daemon and its health watcher for this node, or None when the node's mode serves nothing."""
    gpus = enumerate_gpus()
    settings = resolve(cfg.node_name, cfg.kubeconfig, cfg.apiserver_timeout, cfg.mode, cfg.placement)
    if settings.mode not in MODES:
        log.error(
            "node mode %r (from %s) is not served by this daemon: serving nothing. Label the node "
            "ack.node.gpu.schedule=core_mem|cgpu|share (or pass --mode when the apiserver is unreachable)",
            settings.mode, settings.source, extra={"fields": {"node": cfg.node_name}},
        )
        return None
    unit = cfg.unit()
    check_message_size(gpus, unit)
    node = Node(gpus=tuple(gpus), mode=settings.mode, placement=settings.placement, unit=unit,
                domain=cfg.resource_domain)
    log.info(
        "node %s: %d GPUs, mode %s (%s), placement %s, gpu-mem unit %s", cfg.node_name or "?", len(gpus),
        node.mode, settings.source, node.placement, unit.name,
        extra={"fields": {"node": cfg.node_name, "gpus": len(gpus), "mode": node.mode}},
    )
    for gpu in gpus:
        log.info("GPU %d: %s, %d MiB, %s", gpu.index, gpu.name, gpu.memory_bytes >> 20, gpu.uuid,
                 extra={"fields": {"gpu": gpu.uuid, "gpu_index": gpu.index, "numa": gpu.numa_node}})
    board = DeviceBoard(node)
    allocator = Allocator(node, pair_window_s=cfg.pair_window, mounts=mounts)
    daemon = Daemon(node, Path(cfg.plugin_dir), allocator, board, cfg.pod_resources_socket)
    health = HealthWatcher(
        gpus, on_change=board.set_health, ignored_xids=cfg.ignored_xid_set(), recovery_seconds=cfg.recovery_seconds,
        reset_xids=cfg.reset_xid_set(), store=HealthStore(Path(cfg.state_dir)),
    )
    return daemon, health


def run(cfg: Config) -> int:
    """Serve until SIGTERM or SIGINT; exit code 0 on a clean stop, 2 on a configuration error."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        built = build(cfg, mounts=shim_mounts(cfg))
    except (NvmlUnavailable, UnitTooFine, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_CONFIG
    if built is None:
        stop.wait()
        return 0
    daemon, health = built
    daemon.start()
    try:
        health.start()
    except NvmlUnavailable as exc:
        log.error("cannot watch GPU health: %s", exc)
        daemon.stop()
        return EXIT_CONFIG
    janitor = start_janitor(cfg, daemon)
    stop.wait()
    log.info("stopping")
    if janitor is not None:
        janitor.stop()
    health.stop()
    daemon.stop()
    return 0


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


def start_janitor(cfg: Config, daemon: Daemon) -> Janitor | None:
    """Clean up shim files of ended containers (at start, then every 10 minutes)."""
    if daemon.allocator.mounts is None:
        return None
    janitor = Janitor(shim_paths(cfg), cfg.pod_resources_socket,
                      {daemon.node.resource_name(k) for k in daemon.node.kinds})
    janitor.start()
    return janitor
