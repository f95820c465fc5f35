"""`devplugin serve`: one gRPC server per resource, registered with the kubelet and kept registered."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from watchdog.observers.api import BaseObserver

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind
from devplugin.deviceplugin.devices import DeviceBoard
from devplugin.deviceplugin.registration import RegistrationError, register
from devplugin.deviceplugin.server import PluginServer
from devplugin.deviceplugin.servicer import AdmissionObserver, DevicePluginServicer
from devplugin.deviceplugin.watcher import watch_socket_dir

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
RETRY_DELAYS_S = (0.5, 1, 2, 5, 10, 30)
SETTLE_S = 0.1  # a restarting kubelet deletes sockets then creates kubelet.sock: act once the burst is over


def socket_name(domain: str, kind: Kind) -> str:
    """e.g. aliyun.com-gpu-mem.sock"""
    return f"{domain}-{kind.value}.sock"


class Daemon:
    """Serves every resource of the node's mode and re-registers when the kubelet restarts."""

    def __init__(self, node: Node, plugin_dir: Path, allocator: Allocator, board: DeviceBoard,
                 sync: Callable[[], bool] | None = None, observer: AdmissionObserver | None = None,
                 device_list_strategy: str = "envvar") -> None:
        """`sync` learns which devices containers already hold (PodResources); the daemon registers with the kubelet
        only once it succeeded, retrying with backoff until then. `observer` hears every admission call."""
        self.node = node
        self.plugin_dir = plugin_dir
        self.allocator = allocator
        self.board = board
        self.sync = sync
        self.state_known = threading.Event()
        if sync is None:
            self.state_known.set()
        self.servers = {
            kind: PluginServer(plugin_dir, socket_name(node.domain, kind),
                               DevicePluginServicer(kind, allocator, board, observer, device_list_strategy))
            for kind in node.kinds
        }
        self._registered_with: dict[Kind, int] = {}  # kind -> inode of the kubelet.sock we registered with
        self._poke = threading.Event()
        self._stopping = threading.Event()
        self._failures = 0
        self._retry: threading.Timer | None = None
        self._worker = threading.Thread(target=self._loop, name="reconcile", daemon=True)
        self._observer: BaseObserver | None = None

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for server in self.servers.values():
            server.start()
        names = {KUBELET_SOCKET} | {s.socket_name for s in self.servers.values()}
        self._observer = watch_socket_dir(self.plugin_dir, names, self.poke)
        self._worker.start()
        self.poke()

    def registered(self, kind: Kind) -> bool:
        """Registered with the kubelet that is running now."""
        return kind in self._registered_with

    def poke(self) -> None:
        self._poke.set()

    def stop(self) -> None:
        self._stopping.set()
        self._poke.set()
        if self._retry:
            self._retry.cancel()
        if self._observer is not None:
            self._observer.stop()
        self.board.close()
        for server in self.servers.values():
            server.stop()
        if self._worker.is_alive():
            self._worker.join(timeout=2)
        log.info("stopped; sockets removed", extra={"fields": {"dir": str(self.plugin_dir)}})

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._poke.wait()
            while self._poke.is_set() and not self._stopping.is_set():
                self._poke.clear()
                self._stopping.wait(SETTLE_S)
            if self._stopping.is_set():
                return
            try:
                self.reconcile()
            except Exception as exc:  # noqa: BLE001 - whatever a pod or the kubelet hands us, the worker retries
                log.exception("registering with the kubelet failed")
                self._schedule_retry(f"registering with the kubelet failed: {exc!r}")

    def alive(self) -> tuple[bool, str]:
        """False once the registration worker has died (the liveness probe then restarts the daemon)."""
        if self._worker.ident is not None and not self._worker.is_alive() and not self._stopping.is_set():
            return False, "the kubelet registration worker thread has died"
        return True, "ok"

    def reconcile(self) -> None:
        """Serve every resource and register it with the current kubelet; idempotent."""
        for server in self.servers.values():
            if not server.serving():
                log.info("socket %s is gone: serving again", server.path,
                         extra={"fields": {"resource": server.servicer.resource}})
                self.allocator.kubelet_restarted()  # the kubelet cleared its plugin directory: it restarted
                server.start()
                self._registered_with.pop(server.servicer.kind, None)
        try:
            kubelet_inode = os.stat(self.kubelet_socket).st_ino
        except FileNotFoundError:
            log.info("waiting for the kubelet: %s does not exist", self.kubelet_socket)
            return
        if not self.state_known.is_set():
            if self.sync is not None and self.sync():
                self.state_known.set()
            else:
                self._schedule_retry("the node's held devices are not known yet (the kubelet's PodResources API "
                                     "did not answer): not registering, so that no device is given twice")
                return
        for kind, server in self.servers.items():
            if self._registered_with.get(kind) == kubelet_inode:
                continue
            try:
                register(str(self.kubelet_socket), server.socket_name, server.servicer.resource)
            except RegistrationError as exc:
                self._schedule_retry(str(exc))
                return
            self._registered_with[kind] = kubelet_inode
            self._failures = 0
            log.info("registered %s with the kubelet", server.servicer.resource,
                     extra={"fields": {"resource": server.servicer.resource, "endpoint": server.socket_name}})

    def _schedule_retry(self, why: str) -> None:
        delay = RETRY_DELAYS_S[min(self._failures, len(RETRY_DELAYS_S) - 1)]
        self._failures += 1
        log.error("%s; retrying in %.1f s", why, delay)
        self._retry = threading.Timer(delay, self.poke)
        self._retry.daemon = True
        self._retry.start()
