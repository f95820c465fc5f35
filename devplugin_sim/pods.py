"""Pod and container specs that the kubelet emulator admits: only what device allocation reads."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass
class ContainerSpec:
    """One container: its resource limits (extended resources are whole numbers) and its own env."""

    name: str
    limits: dict[str, int]
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ContainerSpec.name is empty: give every container a name")
        for resource, value in self.limits.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"container {self.name!r}: limit {resource}={value!r} is not a whole number >= 0; "
                    "extended resources are counted in whole units"
                )
        for key, env_value in self.env.items():
            if not isinstance(key, str) or not isinstance(env_value, str) or not key:
                raise ValueError(f"container {self.name!r}: env {key!r}={env_value!r}: names and values must be "
                                 "strings, names non-empty")


@dataclass
class PodSpec:
    """A pod: name, namespace, uid (a fresh uuid4 unless given), its app containers and its init containers
    (admitted first, their devices reused by the app containers as the kubelet does)."""

    name: str
    containers: list[ContainerSpec]
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    init_containers: list[ContainerSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("PodSpec.name is empty: give the pod a name")
        if not self.containers:
            raise ValueError(f"pod {self.namespace}/{self.name} has no containers: give it at least one")
        names = [c.name for c in self.init_containers + self.containers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pod {self.namespace}/{self.name}: container names repeat: {duplicates}")

    @property
    def key(self) -> str:
        """namespace/name, as logs and errors print it."""
        return f"{self.namespace}/{self.name}"
