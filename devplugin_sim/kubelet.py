"""A kubelet emulator: the device-manager half of a kubelet, speaking the real gRPC protocols on unix sockets.

It serves Registration (v1beta1) on <plugin_dir>/kubelet.sock and PodResourcesLister (v1) on its own socket,
dials plugins that register, follows their ListAndWatch streams and admits pods the way the kubelet's device
manager does (kubernetes pkg/kubelet/cm/devicemanager). Init containers are not supported.

Like a starting kubelet, start() deletes every unix socket in plugin_dir (regular files stay) and reads the
checkpoint file kubelet_internal_checkpoint there. See kubelet_admission for the few deliberate deviations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devplugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplugin_sim.kubelet_admission import admit_pod
from devplugin_sim.kubelet_endpoint import DIAL_TIMEOUT_S, PluginEndpoint
from devplugin_sim.kubelet_manager import DeviceManager
from devplugin_sim.kubelet_podresources import PodResourcesServicer
from devplugin_sim.kubelet_registration import KUBELET_SOCKET, RegistrationServicer
from devplugin_sim.kubelet_results import (
    AdmissionError,
    AdmitResult,
    ContainerResult,
    DeviceSpec,
    Mount,
    PluginOptions,
)
from devplugin_sim.kubelet_sockets import (
    check_socket_path,
    cleanup_plugin_directory,
    remove_socket,
    serve_unix,
)
from devplugin_sim.pods import ContainerSpec, PodSpec

__all__ = [
    "AdmissionError", "AdmitResult", "ContainerResult", "ContainerSpec", "DeviceSpec", "KubeletEmulator",
    "Mount", "PluginOptions", "PodSpec",
]

log = logging.getLogger(__name__)

DEFAULT_GRACE_PERIOD_S = 300.0  # devicemanager endpointStopGracePeriod


class KubeletEmulator:
    """The kubelet's device manager, Registration server and PodResources server. Thread-safe.

    plugin_dir: where kubelet.sock is served and plugin sockets live (the kubelet's
    /var/lib/kubelet/device-plugins).
    pod_resources_socket: defaults to <plugin_dir>/../pod-resources/kubelet.sock.
    seed: seeds the random orders (resources per container, available IDs, fill-up, merge order).
    grace_period_s: how long a resource whose plugin went away stays (unhealthy) before it is dropped.
    dial_timeout_s: how long Register waits for the plugin's socket to answer (the kubelet: 10 s).
    """

    def __init__(self, plugin_dir: Path, pod_resources_socket: Path | None = None, *, seed: int | None = None,
                 grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
                 dial_timeout_s: float = DIAL_TIMEOUT_S) -> None:
        if grace_period_s < 0 or dial_timeout_s <= 0:
            raise ValueError(f"grace_period_s={grace_period_s} must be >= 0 and "
                             f"dial_timeout_s={dial_timeout_s} > 0")
        self.plugin_dir = Path(plugin_dir).absolute()
        self.socket_path = self.plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = (Path(pod_resources_socket).absolute() if pod_resources_socket is not None
                                     else self.plugin_dir.parent / "pod-resources" / KUBELET_SOCKET)
        check_socket_path(self.socket_path)
        check_socket_path(self.pod_resources_socket)
        self.dial_timeout_s = dial_timeout_s
        self._m = DeviceManager(self.plugin_dir, seed=seed, grace_period_s=grace_period_s)
        self.checkpoint_path = self._m.checkpoint_path
        self._admit_lock = threading.Lock()  # the kubelet admits one pod at a time
        self._life = threading.Lock()  # start / stop / restart
        self._servers: list = []
        self._running = False

    # --- life cycle -------------------------------------------------------------------------------------

    # mirrors ManagerImpl.Start + server.Start: read the checkpoint, clean the socket dir, serve kubelet.sock
    def start(self) -> None:
        with self._life:
            if self._running:
                raise RuntimeError("kubelet emulator already started")
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
            self._m.load_checkpoint()
            cleanup_plugin_directory(self.plugin_dir)
            remove_socket(self.socket_path)
            remove_socket(self.pod_resources_socket)
            registration = RegistrationServicer(self._connect)
            self._servers = [serve_unix(
                self.socket_path,
                lambda s: api_pb2_grpc.add_RegistrationServicer_to_server(registration, s),
                "kubelet-registration")]
            try:
                pod_resources = PodResourcesServicer(self._m)
                self._servers.append(serve_unix(
                    self.pod_resources_socket,
                    lambda s: pr_grpc.add_PodResourcesListerServicer_to_server(pod_resources, s),
                    "kubelet-podresources"))
            except Exception:
                self._servers[0].stop(None).wait()
                self._servers = []
                raise
            with self._m.lock:
                self._running = True
            log.debug("kubelet emulator started: %s, pod resources on %s", self.socket_path,
                      self.pod_resources_socket)

    # mirrors ManagerImpl.Stop: disconnect every plugin (devices turn unhealthy) and stop serving
    def stop(self) -> None:
        with self._life:
            if not self._running:
                return
            with self._m.lock:
                self._running = False
            for server in self._servers:
                server.stop(None).wait()
            self._servers = []
            self._m.close_endpoints()
            self._m.cancel_timers()
            self._m.write_checkpoint()
            for path in (self.socket_path, self.pod_resources_socket):
                remove_socket(path)
            log.debug("kubelet emulator stopped")
            self._m.notify()

    def restart(self) -> None:
        """A kubelet restart: streams end, all sockets in plugin_dir go, kubelet.sock comes back.

        Allocations survive (through the checkpoint); resources read zero until their plugins register again.
        """
        log.debug("kubelet emulator restarting")
        self.stop()
        self.start()

    def __enter__(self) -> KubeletEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # mirrors server.connectClient: dial at once, ask the options, then follow ListAndWatch
    def _connect(self, r: api_pb2.RegisterRequest) -> None:
        socket_path = str(self.plugin_dir / r.endpoint)
        endpoint = PluginEndpoint.dial(r.resource_name, socket_path, self.dial_timeout_s)
        try:
            endpoint.fetch_options()
            with self._m.lock:
                if not self._running:
                    raise RuntimeError("kubelet is shutting down")
                self._m.install_endpoint(endpoint)
        except Exception:
            endpoint.close()
            raise

    # --- what the node reports ---------------------------------------------------------------------------

    def registered(self) -> dict[str, PluginOptions]:
        """Resource -> options kept, for every resource whose plugin is connected now."""
        with self._m.lock:
            return {r: e.options for r, e in self._m.endpoints.items() if not e.is_stopped()}

    def wait_for(self, predicate: Callable[[KubeletEmulator], bool], timeout: float = 5.0) -> bool:
        """Block until predicate(self) holds (re-checked on every state change); False on timeout."""
        with self._m.changed:
            return self._m.changed.wait_for(lambda: predicate(self), timeout)

    def capacity(self) -> dict[str, int]:
        """Resource -> number of devices, healthy or not (node status capacity)."""
        self._m.drop_expired()
        with self._m.lock:
            return self._m.table.capacity()

    def allocatable(self) -> dict[str, int]:
        """Resource -> number of healthy devices (node status allocatable)."""
        self._m.drop_expired()
        with self._m.lock:
            return self._m.table.allocatable()

    def devices(self, resource: str) -> dict[str, str]:
        """Device ID -> "Healthy" / "Unhealthy" for resource; empty if unknown."""
        self._m.drop_expired()
        with self._m.lock:
            return self._m.table.health(resource)

    def registrations(self) -> int:
        """How many Register calls succeeded since construction."""
        with self._m.lock:
            return self._m.registrations

    def unknown_ids(self) -> list[tuple[str, str]]:
        """(resource, id) pairs a plugin named in GetPreferredAllocation without ever advertising them."""
        with self._m.lock:
            return list(self._m.unknown_ids)

    def allocations(self) -> dict[str, dict[str, dict[str, list[str]]]]:
        """Pod uid -> container -> resource -> device IDs held."""
        with self._m.lock:
            return {uid: {c: {r: list(a.device_ids) for r, a in res.items()} for c, res in conts.items()}
                    for uid, conts in self._m.pod_devices.pods.items()}

    # --- pods --------------------------------------------------------------------------------------------

    def admit(self, pod: PodSpec) -> AdmitResult:
        """Admit pod as the kubelet would; raise AdmissionError with the kubelet's message if it would not."""
        with self._admit_lock:
            with self._m.lock:
                if not self._running:
                    raise RuntimeError("kubelet emulator is not running: call start() before admit()")
            self._m.drop_expired()
            return admit_pod(self._m, pod)

    def remove_pod(self, uid: str) -> None:
        """The pod is gone: free its devices. Unknown uids are ignored."""
        with self._admit_lock:
            if not self._m.release_pod(uid):
                log.debug("remove_pod: no pod with uid %s", uid)
            else:
                log.debug("pod uid %s removed, its devices freed", uid)
