"""What the allocator talks to, as plain types: what Allocate hands a container, the interfaces of the pod cache,
of PodResources entries and of whatever reports to the cluster, and the links every step of the allocation
pipeline reads them through. The kube layer implements them; tests pass stand-ins."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from devplugin.allocation.decision import Decision
from devplugin.allocation.holdings import Holding, Holdings
from devplugin.allocation.node import Node
from devplugin.allocation.requests import PodRequest
from devplugin.allocation.units import Kind


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class Grant:
    """What one Allocate gives a container."""

    gpus: tuple[str, ...]
    device_ids: tuple[str, ...]
    envs: dict[str, str]
    mounts: tuple[MountSpec, ...] = ()
    decision: Decision | None = None


# Called on each shared Allocate with (decision, node, this call's IDs) before anything is committed -> mounts;
# the shim delivery plugs in here.
MountProvider = Callable[[Decision, Node, Sequence[str]], Sequence[MountSpec]]


class HeldDevices(Protocol):
    """A container the kubelet lists as holding devices (PodResources); read only."""

    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def devices(self) -> Mapping[Kind, Sequence[str]]: ...


class KubeletListing(Protocol):
    """One read of the kubelet's PodResources: every pod it lists (namespace, name), and the containers holding
    our devices."""

    @property
    def pods(self) -> frozenset[tuple[str, str]]: ...
    @property
    def containers(self) -> Sequence[HeldDevices]: ...


class PodLookup(Protocol):
    """The pods bound to this node (the pod cache)."""

    def pods(self) -> list[PodRequest] | None:
        """A snapshot without I/O; None while the cache has no view of the node's pods."""

    def fetch_now(self, budget_s: float) -> list[PodRequest] | None:
        """One direct read of the node's pods within the budget; None when the apiserver did not answer."""


# How a pod lookup ends, as Links.on_lookup is told: the cached pods named the container, a direct LIST did, the
# apiserver answered but no pending container matches, or it did not answer within the budget (the last two place
# by node-local pairing).
LOOKUP_OUTCOMES = ("cache", "direct", "not_found", "no_answer")


class Links(Protocol):
    """What the steps of the allocation pipeline call out to, read when they call it: the daemon sets some of these
    after the allocator is built (node_daemon.py), so the steps hold the allocator's links, not copies of them."""

    @property
    def lookup(self) -> PodLookup | None: ...  # the pod cache; None: containers are placed by node-local pairing
    @property
    def reporter(self) -> Reporter: ...
    @property
    def lookup_budget_s(self) -> float: ...
    @property
    def lookup_patience_s(self) -> float: ...
    @property
    def healthy(self) -> Callable[[str], bool]: ...
    @property
    def mounts(self) -> MountProvider | None: ...
    @property
    def resync(self) -> Callable[[], object] | None: ...
    @property
    def refresh(self) -> Callable[[], object] | None: ...
    @property
    def on_lookup(self) -> Callable[[str], object]: ...  # told one of LOOKUP_OUTCOMES
    @property
    def on_guess(self) -> Callable[[], object]: ...
    @property
    def read_kubelet(self) -> Callable[[], KubeletListing | None] | None: ...
    @property
    def read_pods(self) -> Callable[[], frozenset[tuple[str, str]] | None] | None: ...


# The loggers the allocator's lines go to, whichever step writes them (operators filter on these names).
ALLOCATOR_LOG = "devplugin.allocation.allocator"
PAIRING_LOG = "devplugin.allocation.fallback"  # node-local pairing's lines


class Reporter:
    """What the daemon tells the cluster (annotations, Events, node usage); the kube layer overrides it.
    Every method is called under the allocator's lock and must not block."""

    def placed(self, decision: Decision, node: Node) -> None:
        pass

    def refused(self, pod: PodRequest | None, container: str | None, message: str) -> None:
        pass

    def warning(self, pod: PodRequest, reason: str, message: str) -> None:
        pass

    def occupancy_changed(self, holdings: Holdings) -> None:
        pass

    def record_holding(self, pod: PodRequest, holding: Holding, node: Node) -> None:
        """Record on the pod a container learned from the kubelet (restart, or placed without lookup)."""


