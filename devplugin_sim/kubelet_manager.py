"""The emulator's device manager: endpoints, device sets, allocations, grace periods, checkpoint.

Mirrors kubelet devicemanager ManagerImpl's bookkeeping. One re-entrant lock guards all state; the Condition
on it is notified on every registration, ListAndWatch update, stream end, drop and allocation change.
RPCs to plugins are made without holding it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterable
from pathlib import Path

from devplugin.api.deviceplugin.v1beta1 import api_pb2
from devplugin_sim.kubelet_checkpoint import CHECKPOINT_NAME, read_checkpoint, write_checkpoint
from devplugin_sim.kubelet_devices import DeviceTable
from devplugin_sim.kubelet_endpoint import PluginEndpoint
from devplugin_sim.kubelet_pod_devices import PodDevices
from devplugin_sim.pods import PodSpec

log = logging.getLogger(__name__)


class DeviceManager:
    """State shared by the registration server, the stream consumers, admission and PodResources."""

    def __init__(self, plugin_dir: Path, *, seed: int | None, grace_period_s: float) -> None:
        self.plugin_dir = plugin_dir
        self.checkpoint_path = plugin_dir / CHECKPOINT_NAME
        self.grace_period_s = grace_period_s
        self.rng = random.Random(seed)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.table = DeviceTable()
        self.pod_devices = PodDevices()
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.pods: dict[str, PodSpec] = {}  # the admitted pods (what the API server would list)
        self.registrations = 0
        self.unknown_ids: list[tuple[str, str]] = []  # (resource, id) named by a plugin, never advertised
        self._timers: set[threading.Timer] = set()

    def notify(self) -> None:
        with self.lock:
            self.changed.notify_all()

    def shuffled(self, items: Iterable[str]) -> list[str]:
        """Items in random order, like walking a Go map or set; reproducible for a given seed."""
        out = sorted(items)
        self.rng.shuffle(out)
        return out

    # --- plugin connections -------------------------------------------------------------------------------

    # mirrors ManagerImpl.PluginConnected (+ the old addEndpoint's replacement of an existing endpoint)
    def install_endpoint(self, endpoint: PluginEndpoint) -> None:
        with self.lock:
            old = self.endpoints.get(endpoint.resource)
            self.endpoints[endpoint.resource] = endpoint
            self.registrations += 1
            self.changed.notify_all()
        log.debug("resource %s: plugin connected at %s with %s", endpoint.resource, endpoint.socket_path,
                  endpoint.options)
        if old is not None:
            log.debug("resource %s: stopping the endpoint it replaces", endpoint.resource)
            old.close()
        endpoint.start_watch(self.on_list_and_watch, self.on_stream_end)

    # mirrors ManagerImpl.PluginListAndWatchReceiver
    def on_list_and_watch(self, endpoint: PluginEndpoint, devices: list[api_pb2.Device]) -> None:
        with self.lock:
            if self.endpoints.get(endpoint.resource) is not endpoint:
                log.debug("resource %s: update from a replaced endpoint ignored", endpoint.resource)
                return
            self.table.replace(endpoint.resource, devices)
            self._write_checkpoint()
            self.changed.notify_all()

    # mirrors ManagerImpl.PluginDisconnected: all devices unhealthy, the grace period starts
    def on_stream_end(self, endpoint: PluginEndpoint, reason: str) -> None:
        with self.lock:
            if self.endpoints.get(endpoint.resource) is not endpoint:
                return
            log.debug("resource %s: plugin disconnected (%s); devices unhealthy, dropped in %g s unless it "
                      "registers again", endpoint.resource, reason, self.grace_period_s)
            self.table.mark_unhealthy(endpoint.resource)
            self._write_checkpoint()
            self._start_grace_timer(endpoint)
            self.changed.notify_all()

    def _start_grace_timer(self, endpoint: PluginEndpoint) -> None:
        timer = threading.Timer(endpoint.seconds_until_expiry(self.grace_period_s) + 0.01,
                                self._grace_timer_fired, args=(endpoint,))
        timer.daemon = True
        self._timers.add(timer)
        timer.start()

    def _grace_timer_fired(self, endpoint: PluginEndpoint) -> None:
        with self.lock:
            self._timers = {t for t in self._timers if t.is_alive() and t is not threading.current_thread()}
            if self.endpoints.get(endpoint.resource) is endpoint:
                self.drop_expired()

    # mirrors the clean-up in ManagerImpl.GetCapacity: resources whose endpoint stopped too long ago go
    def drop_expired(self) -> None:
        with self.lock:
            expired = [r for r, e in self.endpoints.items() if e.grace_expired(self.grace_period_s)]
            for resource in expired:
                log.debug("resource %s: grace period of %g s over, resource dropped", resource,
                          self.grace_period_s)
                del self.endpoints[resource]
                self.table.drop(resource)
            if expired:
                self._write_checkpoint()
                self.changed.notify_all()

    def cancel_timers(self) -> None:
        with self.lock:
            timers, self._timers = self._timers, set()
        for t in timers:
            t.cancel()

    def close_endpoints(self) -> None:
        """Disconnect every plugin (server.Stop -> disconnectClient): devices turn unhealthy."""
        with self.lock:
            endpoints = list(self.endpoints.values())
        for e in endpoints:
            e.close()
        for e in endpoints:
            e.join()

    # --- allocations --------------------------------------------------------------------------------------

    def release_pod(self, uid: str) -> bool:
        with self.lock:
            had = self.pod_devices.delete(uid)
            known = self.pods.pop(uid, None) is not None
            if had:
                self._write_checkpoint()
            self.changed.notify_all()
            return had or known

    # mirrors ManagerImpl.UpdateAllocatedDevices: forget allocations of pods that are not admitted (any more)
    def update_allocated_devices(self) -> None:
        with self.lock:
            stale = [uid for uid in self.pod_devices.pods if uid not in self.pods]
            for uid in stale:
                log.debug("pod %s: not active, its devices are freed", uid)
                self.pod_devices.delete(uid)
            if stale:
                self._write_checkpoint()
                self.changed.notify_all()

    # mirrors ManagerImpl.isDevicePluginResource
    def is_device_plugin_resource(self, resource: str) -> bool:
        with self.lock:
            return resource in self.table.healthy or resource in self.pod_devices.devices()

    # --- checkpoint -------------------------------------------------------------------------------------

    def _write_checkpoint(self) -> None:
        try:
            write_checkpoint(self.checkpoint_path, self.pod_devices, self.table.healthy)
        except OSError as err:
            log.error("cannot write checkpoint %s: %s", self.checkpoint_path, err)

    def write_checkpoint(self) -> None:
        with self.lock:
            self._write_checkpoint()

    # mirrors ManagerImpl.readCheckpoint: allocations come back; known resources read zero until they register
    def load_checkpoint(self) -> None:
        pod_devices, registered = read_checkpoint(self.checkpoint_path)
        with self.lock:
            self.pod_devices = pod_devices
            self.table.clear()
            self.endpoints.clear()
            for resource in registered:
                self.table.reset_empty(resource)
                self.endpoints[resource] = PluginEndpoint.stopped(resource)
                self._start_grace_timer(self.endpoints[resource])
            self.changed.notify_all()
        log.debug("checkpoint loaded: %d pods with devices, resources %s", len(pod_devices.pods), registered)
