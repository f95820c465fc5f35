"""One container, one decision: where all of a container's resources go, taken once, answered from for every call.

A decision knows its container (pod UID, namespace, pod name, container name) when the pod cache found it; it
then carries the container's whole request (gpu-mem, gpu-core.percentage, gpu-count) and the GPU(s) chosen for
all of it before the first device is handed out. Without pod lookup (no apiserver) a decision is anonymous: its
request grows as the kubelet calls each resource (node-local pairing, see pairing_book.py).
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid as uuidlib
from dataclasses import dataclass, field

from devplugin.allocation.requests import ContainerRequest, PodRequest
from devplugin.allocation.units import Kind

_DIR_SAFE = re.compile(r"[^a-z0-9-]")
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # a container name, as the apiserver validates it


@dataclass(frozen=True)
class ContainerKey:
    """A container as Kubernetes knows it."""

    pod_uid: str
    container: str
    namespace: str = ""
    pod: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


def key_of(pod: PodRequest, container: ContainerRequest) -> ContainerKey:
    return ContainerKey(pod.uid, container.name, pod.namespace, pod.name)


def state_dir_name(key: ContainerKey | None) -> str:
    """The host directory name of a container's shim files: pod UID and the FULL container name (a DNS label, up to
    63 characters), so that a new container never inherits a dead one's files and two containers of a pod never
    share them; a fresh random name for anonymous containers. A name that is not a DNS label (the apiserver allows
    none) is made safe and suffixed with a digest of the original, so two such names still differ."""
    if key is None:
        return "anon-" + uuidlib.uuid4().hex[:20]
    uid = _DIR_SAFE.sub("", key.pod_uid.lower())[:36] or "nouid"
    if _DNS_LABEL.fullmatch(key.container):
        return f"{uid}-{key.container}"
    digest = hashlib.sha256(key.container.encode()).hexdigest()[:12]
    name = _DIR_SAFE.sub("-", key.container.lower())[:50].strip("-") or "c"
    return f"{uid}-{name}-{digest}"


@dataclass
class Decision:
    """Where one container's resources go and what it got so far."""

    gpus: tuple[str, ...]  # GPU UUIDs, in the order their units are handed out
    key: ContainerKey | None = None  # None: anonymous (no pod lookup)
    pod: PodRequest | None = None
    container: ContainerRequest | None = None
    request: dict[Kind, int] = field(default_factory=dict)  # whole-container amounts (the kubelet's sizes)
    per_gpu: dict[Kind, int] = field(default_factory=dict)  # units of each kind on each of `gpus`
    # core_mem, a container that reserves no compute (gpu-mem alone): the compute percent nobody had reserved on
    # each of its GPUs (by UUID) when it was placed, the most its shim lets it take (unreserved.py)
    unreserved: dict[str, int] = field(default_factory=dict)
    preferred: dict[Kind, list[str]] = field(default_factory=dict)
    allocated: dict[Kind, list[str]] = field(default_factory=dict)
    touched: float = 0.0
    dir_name: str = ""
    source: str = ""  # how the GPU was chosen, for logs and Events
    reused_from: ContainerKey | None = None  # an init container whose devices the kubelet reuses for this one
    # the key is the container's own: the only candidate, or named by the kubelet's PodResources; False while it is
    # the likeliest of several containers asking alike (nothing is recorded on a pod for a guess)
    exact: bool = True
    # anonymous: the pods the kubelet listed when the decision opened (a pod listed since is a later admission)
    kubelet_pods: frozenset[tuple[str, str]] | None = None

    def __post_init__(self) -> None:
        if not self.dir_name:
            self.dir_name = state_dir_name(self.key)
        if not self.touched:
            self.touched = time.monotonic()

    @property
    def known(self) -> bool:
        """The container was found in the pod cache: its whole request is known."""
        return self.key is not None

    def amount(self, kind: Kind) -> int:
        """Units of `kind` the container holds (anonymous) or asks for (known)."""
        if self.known:
            return self.request.get(kind, 0)
        return len(self.allocated.get(kind, ()))

    def pending(self, kind: Kind, amount: int) -> bool:
        """This known decision still expects an Allocate of `amount` units of `kind`."""
        return self.known and kind not in self.allocated and self.request.get(kind, 0) == amount

    @property
    def complete(self) -> bool:
        return self.known and all(k in self.allocated for k, n in self.request.items() if n)

    def label(self) -> str:
        return str(self.key) if self.key else "an unidentified container"
