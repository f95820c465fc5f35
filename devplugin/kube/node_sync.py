"""Keep the node view in step with the kubelet: PodResources (who holds which devices) joined with the pod cache.

At start the daemon does not register with the kubelet until one sync succeeded: serving "everything free" before
the node's held devices are known would give devices twice. Afterwards it syncs on a timer and when poked (the pod
cache reconnected), which also names containers placed while the apiserver could not be asked; while a container
placed as the likeliest of several is not named yet, it syncs every GUESS_RETRY_S until the kubelet lists it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.requests import PodRequest
from devplugin.kube.podresources import NodeListing, list_node, list_pods

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 30.0  # with the pod cache, which reports ended pods at once
SYNC_INTERVAL_ALONE_S = 1.0  # without it (a local call of about a millisecond)
GUESS_CONFIRM_DELAY_S = 0.05
# While a container placed as the likeliest of several is not named yet, PodResources is read again this often: a
# loaded kubelet records an Allocate some time after our answer, and the container's record waits for it.
GUESS_RETRY_S = 0.2


class NodeSync:
    """Runs Allocator.reconcile from PodResources and the pod cache, now and then."""

    def __init__(self, allocator: Allocator, pod_resources_socket: str,
                 pods: Callable[[], list[PodRequest] | None] = lambda: None,
                 interval_s: float = SYNC_INTERVAL_S) -> None:
        self.allocator = allocator
        self.socket = pod_resources_socket
        self.pods = pods
        self.interval_s = interval_s
        self.synced = threading.Event()
        self.last_sync = float("-inf")  # time.monotonic() of the last successful read
        self.last_attempt = float("-inf")
        self._poke = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="node-sync", daemon=True)

    def read(self) -> NodeListing | None:
        """The pods the kubelet lists now and the containers holding our devices (None when it cannot be asked);
        no sync."""
        node = self.allocator.node
        return list_node(self.socket, {node.resource_name(k): k for k in node.kinds})

    def read_pods(self) -> frozenset[tuple[str, str]] | None:
        """The pods the kubelet lists now (None when it cannot be asked); their devices are not read, no sync."""
        return list_pods(self.socket)

    def sync(self) -> bool:
        """One round; False when the kubelet's PodResources could not be read."""
        return self.sync_listing() is not None

    def sync_listing(self) -> NodeListing | None:
        """One round, returning what the kubelet listed (None when it could not be read)."""
        asked = self.last_attempt = time.monotonic()
        listing = self.read()
        if listing is None:
            return None
        found = listing.containers
        self.allocator.reconcile(found, self.pods(), as_of=asked, listed=listing.pods)
        self.last_sync = asked
        if not self.synced.is_set():
            held = sum(len(ids) for c in found for ids in c.devices.values())
            log.info("node state known: %d container(s) hold %d device(s)", len(found), held,
                     extra={"fields": {"containers": len(found), "devices": held}})
        self.synced.set()
        return listing

    def refresh(self, max_age_s: float = 0.25) -> bool:
        """sync() unless the last one is younger than max_age_s (many admissions a second share one read)."""
        now = time.monotonic()
        if now - self.last_sync < max_age_s or now - self.last_attempt < max_age_s:
            return True
        return self.sync()

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        self._poke.set()

    def poke_soon(self, delay_s: float = GUESS_CONFIRM_DELAY_S) -> None:
        """A sync in `delay_s` (the kubelet records an Allocate once our answer reached it), off the caller's
        thread: names a container placed as the likeliest of several asking alike."""
        timer = threading.Timer(delay_s, self.poke)
        timer.daemon = True
        timer.start()

    def alive(self) -> tuple[bool, str]:
        """False once the sync thread has died."""
        if self._thread.ident is not None and not self._thread.is_alive() and not self._stopping.is_set():
            return False, "the PodResources sync thread has died"
        return True, "ok"

    def stop(self) -> None:
        self._stopping.set()
        self._poke.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._poke.wait(GUESS_RETRY_S if self.allocator.guesses() else self.interval_s)
            self._poke.clear()
            if self._stopping.is_set():
                return
            try:
                self.sync()
            except Exception:  # a sync that fails must not end the loop; the next one retries
                log.exception("node sync failed; retrying in %.0f s", self.interval_s)
