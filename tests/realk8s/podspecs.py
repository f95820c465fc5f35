"""Pod manifests for the realk8s scenarios: containers asking for gpu-mem / gpu-core.percentage / gpu-count, init
containers and sidecars, labels and annotations; and the waits on what became of them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from tests.realk8s.images import WORKLOAD_IMAGE

MEM, CORE, COUNT = "aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"
IMAGE = WORKLOAD_IMAGE  # the workload probe: prints what the container sees of its GPUs, then waits


@dataclass(frozen=True)
class Ask:
    """One container's request: gpu-mem units, gpu-core percent, whole GPUs; init/sidecar position."""

    mem: int = 0
    core: int = 0
    count: int = 0
    name: str = ""
    init: bool = False
    sidecar: bool = False  # an init container with restartPolicy: Always
    env: tuple[tuple[str, str], ...] = ()

    def limits(self) -> dict[str, str]:
        out = {}
        if self.mem:
            out[MEM] = str(self.mem)
        if self.core:
            out[CORE] = str(self.core)
        if self.count:
            out[COUNT] = str(self.count)
        return out


def container(ask: Ask, name: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": ask.name or name, "image": IMAGE}
    limits = ask.limits()
    if limits:
        c["resources"] = {"limits": limits}
    env = list(ask.env)
    if ask.init and not ask.sidecar:  # an init container runs to completion: the probe prints its view and exits
        env.append(("PROBE_EXIT", "0"))
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env]
    if ask.sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(name: str, asks: Iterable[Ask], labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, node_name: str = "") -> dict[str, Any]:
    """A bare pod; containers named c0, c1, ... and init containers i0, i1, ... unless named."""
    asks = list(asks)
    inits = [container(a, f"i{i}") for i, a in enumerate(x for x in asks if x.init or x.sidecar)]
    apps = [container(a, f"c{i}") for i, a in enumerate(x for x in asks if not (x.init or x.sidecar))]
    spec: dict[str, Any] = {"containers": apps, "restartPolicy": "Never", "automountServiceAccountToken": False}
    if inits:
        spec["initContainers"] = inits
    if node_name:
        spec["nodeName"] = node_name
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def on_node(body: dict[str, Any], node: str) -> dict[str, Any]:
    """Require the node by name (node affinity on metadata.name): still through kube-scheduler and the extender."""
    body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    return body


def refusal(p: k8s.V1Pod) -> str:
    """The node's refusal of a pod ('' if none): the kubelet fails it with reason UnexpectedAdmissionError."""
    st = p.status
    if st is not None and st.phase == "Failed":
        return f"{st.reason}: {st.message}"
    return ""


def wait_pods(core: k8s.CoreV1Api, ns: str, done: Callable[[list[k8s.V1Pod]], bool], what: str,
              timeout: float = 60) -> list[k8s.V1Pod]:
    """Poll the namespace's pods until `done`; AssertionError with each pod's phase and message otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        pods = core.list_namespaced_pod(ns).items
        if done(pods):
            return pods
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:.0f} s: " + "; ".join(describe(p) for p in pods))
        time.sleep(0.2)


def describe(p: k8s.V1Pod) -> str:
    st = p.status
    conds = [f"{c.type}={c.status}({c.reason}: {c.message})" for c in (st.conditions or []) if c.status != "True"]
    return (f"{p.metadata.name} on {p.spec.node_name or '-'}: {st.phase} {st.reason or ''} {st.message or ''} "
            + " ".join(conds)).strip()


def settled(p: k8s.V1Pod) -> bool:
    """Running, or failed by its node."""
    return p.status.phase in ("Running", "Failed")


def recorded(p: k8s.V1Pod) -> bool:
    """The node daemon's record (gpushare.io/allocated) names every app container of the pod that asks for a GPU.
    The daemon writes it just after admission, off the admission path, while the kubelet writes the pod's status
    on its own: a pod can be Running a moment before its record is there (longer on a loaded apiserver)."""
    raw = (p.metadata.annotations or {}).get("gpushare.io/allocated")
    want = {c.name for c in p.spec.containers
            if any(str(v) not in ("0", "0m") for k, v in ((c.resources.limits if c.resources else None) or {}).items()
                   if k in (MEM, CORE, COUNT))}  # a zero quantity asks for nothing: no device plugin call, no record
    if not raw:
        return not want
    return want <= set(json.loads(raw).get("containers") or {})


def settled_and_recorded(p: k8s.V1Pod) -> bool:
    """Failed by its node, or Running with its record written."""
    return p.status.phase == "Failed" or (p.status.phase == "Running" and recorded(p))


def unschedulable(p: k8s.V1Pod) -> str:
    """kube-scheduler's message when it could not place the pod ('' otherwise)."""
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return c.message or "Unschedulable"
    return ""
