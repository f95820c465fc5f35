"""`devplugin dra`: the DRA kubelet plugin on this node's GPUs until SIGTERM (devplugin/dra/plugin.py)."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path

from prometheus_client import generate_latest

from devplugin import contract
from devplugin.app.dra_config import DraConfig
from devplugin.app.endpoints import start_endpoints, stop_endpoints
from devplugin.dra.checkpoint import FILE as CHECKPOINT_FILE
from devplugin.dra.checkpoint import CheckpointError
from devplugin.dra.conflicts import ConflictCheck
from devplugin.dra.metrics import DraMetrics
from devplugin.dra.plugin import DraPlugin
from devplugin.dra.pods import PodsOnNode
from devplugin.dra.prepare import Preparer
from devplugin.dra.publisher import SlicePublisher
from devplugin.dra.slices import build_slices, devices_by_name
from devplugin.gpu.facts import read_facts
from devplugin.gpu.health import HealthWatcher
from devplugin.gpu.health_state import HealthStore
from devplugin.gpu.inventory import NvmlUnavailable, enumerate_gpus
from devplugin.gpu.layout_watch import LayoutChange, LayoutWatcher
from devplugin.isolation.shim_files import ShimPaths

log = logging.getLogger(__name__)

EXIT_CONFIG = 2
API_TIMEOUT_S = 10
MODE_CHECK_S = 2.0


def shim_paths(cfg: DraConfig) -> ShimPaths | None:
    """Where shares get their shim files, per --shim; ValueError when --shim on cannot hold."""
    if cfg.shim == "off":
        return None
    paths = ShimPaths(host_root=Path(cfg.shim_state_dir), host_lib=Path(cfg.shim_lib))
    if not paths.host_lib.is_file():
        if cfg.shim == "on":
            raise ValueError(f"--shim on but the shim library {paths.host_lib} does not exist: install it (the "
                             "DaemonSet's init container copies it) or set --shim-lib")
        log.warning("shim library %s not found: shares get their GPUs and limits as env only, without enforcement "
                    "(set --shim on to refuse to start instead)", paths.host_lib)
        return None
    return paths


def run(cfg: DraConfig) -> int:
    """Serve until SIGTERM or SIGINT; 0 on a clean stop, 2 on a configuration error."""
    from kubernetes import client

    from devplugin.kube.client import KubeConfigError, load_api_client
    from devplugin.kube.node_watch import NodeWatch

    try:
        gpus = enumerate_gpus()
        facts = read_facts(gpus)
        shim = shim_paths(cfg)
        api = load_api_client(cfg.kubeconfig)
    except (NvmlUnavailable, ValueError, KubeConfigError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_CONFIG
    node = cfg.node_name
    unhealthy: dict[str, str] = {}
    lock = threading.Lock()

    watch_box: list[NodeWatch] = []

    def node_uid() -> str:
        obj = watch_box[0].node() if watch_box else None
        return str(((obj or {}).get("metadata") or {}).get("uid") or "")

    def desired(generation: int) -> list[dict[str, object]]:
        with lock:
            sick = dict(unhealthy)
        return build_slices(node, gpus, facts, sick, generation, node_uid())

    publisher = SlicePublisher(api, node, desired, interval_s=cfg.resync_seconds)
    resource = client.ResourceV1Api(api)
    core = client.CoreV1Api(api)

    def read_claim(namespace: str, name: str) -> object:
        resp = resource.read_namespaced_resource_claim(name, namespace, _preload_content=False,
                                                       _request_timeout=API_TIMEOUT_S)
        return json.loads(resp.data)  # type: ignore[attr-defined]

    def read_pod(namespace: str, name: str) -> object:
        resp = core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=API_TIMEOUT_S)
        return json.loads(resp.data)  # type: ignore[attr-defined]

    pods = PodsOnNode(api, node)  # the pods a claim is reserved for, without a GET each (devplugin/dra/pods.py)
    try:
        preparer = Preparer(node, devices_by_name(gpus), read_claim, Path(cfg.cdi_dir),
                            Path(cfg.plugin_dir) / CHECKPOINT_FILE, shim=shim,
                            conflicts=ConflictCheck(read_pod, pods.get))
    except (CheckpointError, OSError) as exc:
        log.error("cannot read what this plugin prepared before: %s. Repair or move the file away only after every "
                  "pod with a claim of this node ended (their claims would not be unprepared)", exc)
        return EXIT_CONFIG
    metrics = DraMetrics(node, preparer.held)
    preparer.observe = metrics.observe
    plugin_box: list[DraPlugin] = []
    watch = NodeWatch(api, node, lambda labels: plugin_box[0].apply_mode() if plugin_box else None,
                      on_recreated=publisher.poke)
    watch_box.append(watch)
    plugin = DraPlugin(node, preparer, publisher, Path(cfg.plugin_dir), Path(cfg.plugins_registry_dir),
                       labels=watch.labels)
    plugin_box.append(plugin)

    stale: set[str] = set()  # devices whose GPU's MIG layout changed: tainted while this plugin runs

    def health_changed(uuid: str, healthy: bool, reason: str) -> bool:
        with lock:
            if healthy and uuid in stale:
                return False
            before = uuid in unhealthy
            if healthy:
                unhealthy.pop(uuid, None)
            else:
                unhealthy[uuid] = reason
            changed = before == healthy
        if changed:
            log.warning("GPU %s is %s (%s): updating its device taint", uuid, "healthy" if healthy else "unhealthy",
                        reason, extra={"fields": {"node": node, "gpu": uuid}})
            publisher.poke()
        return changed

    health = HealthWatcher(gpus, on_change=health_changed, ignored_xids=cfg.xid_set("ignored_xids"),
                           recovery_seconds=cfg.recovery_seconds, reset_xids=cfg.xid_set("reset_xids"),
                           store=HealthStore(Path(cfg.state_dir)))

    def layout_changed(change: LayoutChange) -> None:
        for uuid in change.affected:
            with lock:
                stale.add(uuid)
            health_changed(uuid, False, change.reason)

    layout = LayoutWatcher(gpus, layout_changed, cfg.mig_check_interval)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        servers = start_endpoints(cfg, plugin.ready, plugin.alive, lambda: generate_latest(metrics.registry),
                                  "the DRA plugin's metrics")
    except (OSError, RuntimeError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_CONFIG
    try:
        health.start()
    except NvmlUnavailable as exc:
        log.error("cannot watch GPU health: %s", exc)
        stop_endpoints(servers)
        return EXIT_CONFIG
    layout.start()
    log.info("node %s: %d GPUs for DRA driver %s", node, len(gpus), contract.DRA_DRIVER,
             extra={"fields": {"node": node, "gpus": len(gpus)}})
    watch.start()
    pods.start()
    plugin.start()
    try:
        while not stop.wait(MODE_CHECK_S):
            plugin.apply_mode()
    finally:
        plugin.stop()
        layout.stop()
        health.stop()
        watch.stop()
        pods.stop()
        stop_endpoints(servers)
        log.info("stopped", extra={"fields": {"node": node}})
    return 0
