"""Deliver the isolation shim on Allocate: per-container limits and mounts, and cleanup of dead containers' files.

`devplugin/isolation/shim_files.py` writes the files; this module turns a container's decision into limits, decides when
the shim is mounted (per --shim), and finds which container directories are still live from PodResources.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from devplugin import contract
from devplugin.allocation.decision import Decision
from devplugin.allocation.node import Node
from devplugin.allocation.ports import MountProvider, MountSpec
from devplugin.allocation.units import Kind
from devplugin.isolation.shim_files import Owner, ShimPaths, cleanup, prepare_container
from devplugin.kube.podresources import HeldContainer, list_containers

log = logging.getLogger(__name__)

CLEANUP_INTERVAL_S = 600.0
MIN_AGE_S = 600.0  # a directory younger than this may belong to a container still starting


def limits_for(decision: Decision, node: Node) -> contract.Limits:
    """What the shim enforces for this container on each of its GPUs: memory cap (cgpu, core_mem) and compute
    share (core_mem). On core_mem, a container granted no gpu-core.percentage (yet) runs on compute nobody
    reserved (unreserved.py): at most what was unreserved on the GPU when it was placed, giving way to its
    neighbours; a gpu-core.percentage call that follows replaces that with its share (shim_files.merge_limits)."""
    if decision.known:  # what the resources granted so far bring (the container may still be a guess)
        mem, core = (decision.per_gpu.get(k, 0) if k in decision.allocated else 0 for k in (Kind.MEM, Kind.CORE))
    else:
        mem, core = decision.amount(Kind.MEM), decision.amount(Kind.CORE)
    memory = mem * node.unit.bytes if node.isolates_memory() else 0
    if node.isolates_compute() and not core and mem:
        return contract.Limits(devices=tuple(
            contract.DeviceLimit(uuid=uuid, memory_limit=memory, sm_limit=decision.unreserved.get(uuid, 100),
                                 sm_unreserved=True) for uuid in decision.gpus))
    share = core if node.isolates_compute() and core else 100
    return contract.Limits(devices=tuple(contract.DeviceLimit(uuid=uuid, memory_limit=memory, sm_limit=share)
                                         for uuid in decision.gpus))


def shim_provider(paths: ShimPaths) -> MountProvider:
    """A MountProvider for Allocator: writes the container's limits file and returns the shim's mounts. The first
    Allocate of a container starts from a fresh directory; later ones (its other resource) add to it. `decision`
    is the container as it will be once this call is granted (its `allocated` includes this call's resource)."""

    def provide(decision: Decision, node: Node, ids: Sequence[str]) -> Sequence[MountSpec]:
        if node.mode == "share":  # no isolation: the application limits itself from its env
            return ()
        held = [i for done in decision.allocated.values() for i in done]
        first = len(decision.allocated) <= 1  # `decision` already counts this call's resource
        owner = Owner(devices=tuple(dict.fromkeys([*held, *ids])), pod_uid=decision.key.pod_uid if decision.key
                      else "", namespace=decision.key.namespace if decision.key else "",
                      pod=decision.key.pod if decision.key else "",
                      container=decision.key.container if decision.key else "")
        return prepare_container(paths, decision.dir_name, limits_for(decision, node), owner=owner, fresh=first)

    return provide


def live_devices(containers: list[HeldContainer]) -> set[str]:
    """Every device ID some live container holds."""
    return {i for container in containers for ids in container.devices.values() for i in ids}


class Janitor:
    """Removes per-container shim files of containers the kubelet no longer knows, at start and every 10 min."""

    def __init__(self, paths: ShimPaths, pod_resources_socket: str, resources: Mapping[str, Kind],
                 interval_s: float = CLEANUP_INTERVAL_S, min_age_s: float = MIN_AGE_S) -> None:
        self.paths = paths
        self.socket = pod_resources_socket
        self.resources = resources
        self.interval_s = interval_s
        self.min_age_s = min_age_s
        self._timer: threading.Timer | None = None
        self._stopped = threading.Event()

    def sweep(self) -> list[str]:
        containers = list_containers(self.socket, self.resources)
        if containers is None:
            return []  # never delete when the kubelet cannot say what is live
        removed = cleanup(self.paths, live_devices(containers), self.min_age_s)
        if removed:
            log.info("removed shim files of %d ended containers", len(removed),
                     extra={"fields": {"removed": ",".join(removed)}})
        return removed

    def start(self) -> None:
        self._run()

    def _run(self) -> None:
        if self._stopped.is_set():
            return
        try:
            self.sweep()
        except OSError as exc:
            log.warning("shim cleanup failed: %s", exc)
        self._timer = threading.Timer(self.interval_s, self._run)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._timer:
            self._timer.cancel()

