"""Nodes and pods as the apiserver returns them (JSON dicts), for the scheduler and inspect tests."""

from __future__ import annotations

import itertools
from typing import Any

from devplugin.contract import (
    ANN_NODE_GPUS,
    ANN_NODE_USAGE,
    LABEL_MODE,
    LABEL_PLACEMENT,
    GpuUsage,
    NodeGpu,
    NodeInventory,
    NodeUsage,
)

MEM, CORE, COUNT = "aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"
_uids = itertools.count(1)
USAGE_AFTER_RECORDS = 1 << 62  # later than any record time a test writes


def inventory(gpus: int = 4, units: int = 15, mode: str = "core_mem", placement: str = "binpack",
              unhealthy: tuple[int, ...] = (), sizes: list[int] | None = None, node: str = "n") -> NodeInventory:
    sizes = sizes or [units] * gpus
    return NodeInventory(mode=mode, placement=placement, mem_unit_mib=1024, gpus=tuple(
        NodeGpu(i, f"GPU-{node}-{i}", "Fake A10", s, s * 1024, i not in unhealthy) for i, s in enumerate(sizes)))


def node(name: str, gpus: int = 4, units: int = 15, mode: str = "core_mem", placement: str | None = None,
         unhealthy: tuple[int, ...] = (), usage: dict[int, GpuUsage] | None = None, sizes: list[int] | None = None,
         labels: dict[str, str] | None = None, ip: str = "", usage_time_ns: int = USAGE_AFTER_RECORDS) -> dict:
    """A Node; `usage` (the daemon's count) is published at `usage_time_ns`: by default after every record."""
    ann = {ANN_NODE_GPUS: inventory(gpus, units, mode, placement or "binpack", unhealthy, sizes, name).render()}
    if usage is not None:
        ann[ANN_NODE_USAGE] = NodeUsage(usage, usage_time_ns).render()
    lab = {LABEL_MODE: mode, **(labels or {})}
    if placement:
        lab[LABEL_PLACEMENT] = placement
    obj: dict[str, Any] = {"metadata": {"name": name, "labels": lab, "annotations": ann}, "spec": {},
                           "status": {}}
    if ip:
        obj["status"]["addresses"] = [{"type": "InternalIP", "address": ip}]
    return obj


def container(name: str = "main", mem: int = 0, core: int = 0, count: int = 0, env: dict[str, str] | None = None,
              extra: dict[str, str] | None = None) -> dict:
    limits = {k: str(v) for k, v in ((MEM, mem), (CORE, core), (COUNT, count)) if v}
    limits.update(extra or {})
    c: dict[str, Any] = {"name": name, "image": "cuda", "resources": {"limits": limits, "requests": dict(limits)}}
    if env is not None:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return c


def pod(name: str = "p", mem: int = 0, core: int = 0, count: int = 0, namespace: str = "default",
        node_name: str = "", annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        containers: list[dict] | None = None, init: list[dict] | None = None, phase: str = "Pending",
        uid: str = "") -> dict:
    spec: dict[str, Any] = {"containers": containers or [container(mem=mem, core=core, count=count)]}
    if init:
        spec["initContainers"] = init
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{next(_uids)}",
                         "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": phase}}


def bind(state: Any, cluster: Any, namespace: str, name: str, uid: str, node: str) -> Any:
    """kube-scheduler's order: its filter passed `node` for the pod, then it calls bind (which binds nowhere else)."""
    from devplugin.scheduler import extender

    state.filtered(uid, [node])
    return extender.bind(state, cluster, namespace, name, uid, node)
