"""Merge a container's Allocate answers into what its runtime gets, the way the kubelet does."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from devplugin.api.deviceplugin.v1beta1 import api_pb2
from devplugin_sim.kubelet_results import DeviceSpec, Mount

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """The merged envs, mounts, devices, annotations and CDI devices, and the conflicts found."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[DeviceSpec] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


# mirrors podDevices.deviceRunContainerOptions. The kubelet walks the container's resources as a Go map, so
# the caller passes them in random order: which of two differing values wins is a matter of chance.
def merge_responses(container: str, responses: list[tuple[str, api_pb2.ContainerAllocateResponse]],
                    spec_env: dict[str, str]) -> RunOptions:
    """First key wins across resources; differing duplicates become conflicts; spec_env overrides envs."""
    out = RunOptions()
    env_from: dict[str, str] = {}
    mount_from: dict[str, tuple[str, str]] = {}
    dev_from: dict[str, tuple[str, str]] = {}
    ann_from: dict[str, str] = {}
    cdi_seen: set[str] = set()

    def conflict(text: str) -> None:
        out.conflicts.append(text)
        log.error("container %s: %s", container, text)

    for resource, resp in responses:
        for k, v in resp.envs.items():
            if k in out.envs:
                if out.envs[k] != v:
                    conflict(f"Environment variable {k} has conflicting setting: {out.envs[k]} "
                             f"({env_from[k]}) and {v} ({resource})")
                continue
            out.envs[k] = v
            env_from[k] = resource
        for d in resp.devices:
            if d.container_path in dev_from:
                host, first = dev_from[d.container_path]
                if host != d.host_path:
                    conflict(f"Container device {d.container_path} has conflicting mapping host devices: "
                             f"{host} ({first}) and {d.host_path} ({resource})")
                continue
            dev_from[d.container_path] = (d.host_path, resource)
            out.devices.append(DeviceSpec(d.container_path, d.host_path, d.permissions))
        for m in resp.mounts:
            if m.container_path in mount_from:
                host, first = mount_from[m.container_path]
                if host != m.host_path:
                    conflict(f"Container mount {m.container_path} has conflicting mapping host mounts: "
                             f"{host} ({first}) and {m.host_path} ({resource})")
                continue
            mount_from[m.container_path] = (m.host_path, resource)
            out.mounts.append(Mount(m.container_path, m.host_path, m.read_only))
        for k, v in resp.annotations.items():
            if k in out.annotations:
                if out.annotations[k] != v:
                    conflict(f"Annotation {k} has conflicting setting: {out.annotations[k]} ({ann_from[k]}) "
                             f"and {v} ({resource})")
                continue
            out.annotations[k] = v
            ann_from[k] = resource
        for c in resp.cdi_devices:
            if c.name not in cdi_seen:
                cdi_seen.add(c.name)
                out.cdi_devices.append(c.name)
    # mirrors kubelet GenerateRunContainerOptions: the container's own env comes after the device envs, and
    # the runtime keeps the last value of a repeated name, so the spec overrides the plugin.
    for k, v in spec_env.items():
        if k in out.envs and out.envs[k] != v:
            log.debug("container %s: spec env %s=%s overrides device env %s", container, k, v, out.envs[k])
        out.envs[k] = v
    return out
