"""The DRA kubelet plugin, assembled: the node's GPUs and their health, the ResourceSlice publisher, the
preparer, the DRA and registration sockets, and the node's allocation mode.

Mode (node label `gpushare.io/allocation`): on `dra` the slices are published and new claims prepared; on any other
value (or none) nothing is published and new claims are refused, with the reason in the log and in /readyz. A
relabel away from `dra` deletes the slices once no claim is prepared here (claims in flight keep their devices).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devplugin import contract
from devplugin.dra.prepare import Preparer
from devplugin.dra.publisher import SlicePublisher
from devplugin.dra.servicer import DraServicer, RegistrationServicer, add_dra, add_registration
from devplugin.socket_server import SocketServer

log = logging.getLogger(__name__)

DRA_SOCKET = "dra.sock"
REGISTRATION_SOCKET = f"{contract.DRA_DRIVER}-reg.sock"
REREGISTER_DELAY_S = 5.0


def mode_problem(labels: dict[str, str] | None) -> str:
    """"" when the node's labels say DRA, else why this node does not serve DRA."""
    if labels is None:
        return "the node's labels are not known yet (waiting for the apiserver)"
    value = labels.get(contract.LABEL_ALLOCATION)
    if value == contract.ALLOCATION_DRA:
        return ""
    shown = f"{contract.LABEL_ALLOCATION}={value}" if value is not None else f"no label {contract.LABEL_ALLOCATION}"
    return (f"node has {shown}: it serves GPUs through the device plugin; label it "
            f"{contract.LABEL_ALLOCATION}={contract.ALLOCATION_DRA} to serve them through DRA")


@dataclass
class DraPlugin:
    node: str
    preparer: Preparer
    publisher: SlicePublisher | None
    plugin_dir: Path
    registry_dir: Path
    labels: Callable[[], dict[str, str] | None] = lambda: None
    registered: threading.Event = field(default_factory=threading.Event)
    registration_error: str = ""

    def __post_init__(self) -> None:
        self.endpoint = self.plugin_dir / DRA_SOCKET
        self.dra = SocketServer(self.endpoint, add_dra(DraServicer(self.preparer)), "dra")
        reg = RegistrationServicer(contract.DRA_DRIVER, str(self.endpoint), self.on_registration)
        self.registration = SocketServer(self.registry_dir / REGISTRATION_SOCKET, add_registration(reg),
                                         "dra-registration", workers=2)
        self.preparer.serving = self.serving
        self._publishing = False
        self._said = "\0"  # the last reason logged, so that apply_mode() can run often
        self._swept = False  # slices of an earlier run removed on a node out of DRA mode
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    # ---- mode ---------------------------------------------------------------------------------------------

    def serving(self) -> str:
        return mode_problem(self.labels())

    def apply_mode(self) -> None:
        """Publish when the node is in DRA mode; stop (and delete the slices) once it left and nothing is held."""
        if self.publisher is None:
            return
        with self._lock:
            why = self.serving()
            said, self._said = self._said, why
            if not why and not self._publishing:
                log.info("node is labelled %s=%s: publishing its GPUs as ResourceSlices", contract.LABEL_ALLOCATION,
                         contract.ALLOCATION_DRA, extra={"fields": {"node": self.node}})
                self.publisher.start()
                self._publishing = True
            elif why and self._publishing:
                held = self.preparer.held()
                if held and said != why:
                    log.warning("%s; %d prepared claim(s) still hold GPUs: the ResourceSlices stay until they end",
                                why, held, extra={"fields": {"node": self.node}})
                if held:
                    return
                log.warning("%s: deleting this node's ResourceSlices", why, extra={"fields": {"node": self.node}})
                self.publisher.stop()
                self.publisher.delete()
                self._publishing = False
            elif why and said != why:
                log.warning("%s: publishing nothing", why, extra={"fields": {"node": self.node}})
                if self.labels() is not None and not self.preparer.held() and not self._swept:
                    # Slices an earlier run left (the label was removed while the plugin was down) would draw claims
                    # this node now refuses.
                    self._swept = True
                    self.publisher.delete()

    # ---- registration -------------------------------------------------------------------------------------

    def on_registration(self, ok: bool, error: str) -> None:
        if ok:
            self.registration_error = ""
            self.registered.set()
            log.info("the kubelet registered DRA driver %s (endpoint %s)", contract.DRA_DRIVER, self.endpoint,
                     extra={"fields": {"node": self.node}})
            return
        self.registered.clear()
        self.registration_error = error or "the kubelet refused the registration without a reason"
        log.error("the kubelet refused DRA driver %s: %s; registering again in %.0f s (check the kubelet's log and "
                  "that its DRA feature is on)", contract.DRA_DRIVER, self.registration_error, REREGISTER_DELAY_S,
                  extra={"fields": {"node": self.node}})
        self._timer = threading.Timer(REREGISTER_DELAY_S, self._reregister)
        self._timer.daemon = True
        self._timer.start()

    def _reregister(self) -> None:
        """A new registration socket: the kubelet's plugin watcher sees it and calls GetInfo again."""
        self.registration.start()

    # ---- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> DraPlugin:
        self.dra.start()
        self.registration.start()
        self.apply_mode()
        return self

    def stop(self) -> None:
        """Stop serving; the slices and the prepared claims stay (see the module docstring)."""
        if self._timer is not None:
            self._timer.cancel()
        self.registration.stop()
        self.dra.stop()
        if self.publisher is not None:
            self.publisher.stop()

    def ready(self) -> tuple[bool, str]:
        why = self.serving()
        if why:
            return False, why
        if not self.dra.serving():
            return False, f"the DRA socket {self.endpoint} is gone"
        if not self.registered.is_set():
            return False, ("not registered with the kubelet yet" +
                           (f": {self.registration_error}" if self.registration_error else
                            f" (its plugin watcher reads {self.registry_dir})"))
        if self.publisher is not None and not self.publisher.published.is_set():
            return False, self.publisher.last_error or "ResourceSlices not published yet"
        return True, "ok"

    def alive(self) -> tuple[bool, str]:
        if self.publisher is not None and self._publishing and not self.publisher.alive():
            return False, "the ResourceSlice publisher thread stopped"
        return True, "ok"
