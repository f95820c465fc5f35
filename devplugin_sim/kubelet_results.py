"""What an admission by the kubelet emulator returns, and the error it raises."""

from __future__ import annotations

from dataclasses import dataclass, field

from devplugin_sim.pods import PodSpec

# The reason the kubelet gives a pod whose device allocation failed (cm/admission ErrorReasonUnexpected).
REASON_UNEXPECTED = "UnexpectedAdmissionError"


@dataclass(frozen=True)
class PluginOptions:
    """The DevicePluginOptions kept for a resource: the plugin's GetDevicePluginOptions answer."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@dataclass(frozen=True)
class Mount:
    """A host path mounted into the container (keyed by container_path when merged)."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class DeviceSpec:
    """A device node passed into the container (keyed by container_path when merged)."""

    container_path: str
    host_path: str
    permissions: str


@dataclass
class ContainerResult:
    """What one container got.

    envs: device envs merged first-key-wins, then the container spec's own env on top.
    device_ids: resource -> the IDs sent in Allocate, in the order sent.
    calls: the RPCs made for this container, in order, e.g. "Allocate aliyun.com/gpu-mem".
    conflicts: keys two resources set differently (the kubelet only logs these; the first one kept wins).
    unknown_ids: resource -> IDs the plugin named in GetPreferredAllocation but never advertised.
    """

    name: str
    envs: dict[str, str]
    mounts: list[Mount]
    devices: list[DeviceSpec]
    annotations: dict[str, str]
    device_ids: dict[str, list[str]]
    calls: list[str]
    conflicts: list[str]
    cdi_devices: list[str] = field(default_factory=list)
    unknown_ids: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class AdmitResult:
    """An admitted pod and what each of its containers got, in spec order."""

    pod: PodSpec
    containers: list[ContainerResult]
    init_containers: list[ContainerResult] = field(default_factory=list)

    def container(self, name: str) -> ContainerResult:
        """The result of the container called name."""
        for c in self.containers:
            if c.name == name:
                return c
        names = [c.name for c in self.containers]
        raise KeyError(f"pod {self.pod.key} has no container {name!r}: it has {names}")


class AdmissionError(Exception):
    """A pod the kubelet would reject: str() is the kubelet's message, .reason its reason, .cause the error.

    For device allocation failures the message reads like the kubelet's:
    "Allocate failed due to <cause>, which is unexpected", where cause carries the plugin's gRPC error text.
    calls lists the RPCs made before the failure (all containers).
    """

    def __init__(self, cause: str, *, reason: str = REASON_UNEXPECTED, message: str | None = None,
                 calls: list[str] | None = None) -> None:
        self.cause = cause
        self.reason = reason
        self.calls = list(calls or [])
        if message is None:
            message = f"Allocate failed due to {cause}, which is unexpected"
        super().__init__(message)
