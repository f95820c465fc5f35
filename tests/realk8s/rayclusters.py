"""RayCluster manifests as docs/guide/kuberay.md writes them, sized for the test machine (2 cores): a head that runs no
tasks and asks for no GPU (NVIDIA_VISIBLE_DEVICES=void, as the docs set it for clusters without the webhook), and
one GPU worker group whose workers each take a slice of one GPU through `aliyun.com/gpu-mem` and
`aliyun.com/gpu-core.percentage` limits, with `num-gpus` in `rayStartParams` (KubeRay cannot count GPUs from those
limits). Every Ray container gets /dev/shm as an emptyDir of medium Memory, as Ray's docs advise for the object
store (KubeRay adds the same when it is missing), and a small object store.

CPU and memory requests are bookkeeping only on the test nodes (no cgroups), kept small all the same; KubeRay passes
the container's CPU and memory limits to `ray start` (`--num-cpus`, `--memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.realk8s.images import RAY_IMAGE

MEM, CORE = "aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage"
GROUP = "gpu-slice"
OBJECT_STORE_BYTES = "100000000"  # Ray's minimum is 75 MB; its default, 30 % of the machine's memory, is too much here
SHM = {"name": "shared-mem", "emptyDir": {"medium": "Memory"}}
SHM_MOUNT = {"name": "shared-mem", "mountPath": "/dev/shm"}


@dataclass(frozen=True)
class Workers:
    """The GPU worker group: each worker's slice and the group's replica bounds (KubeRay's GPU guide: 0 to 5)."""

    mem: int = 4  # GiB of one GPU
    core: int = 30  # percent of that GPU
    replicas: int = 1
    min_replicas: int = 0
    max_replicas: int = 5
    env: tuple[tuple[str, str], ...] = field(default=())
    num_gpus: str | None = "1"  # rayStartParams' num-gpus; None leaves it out


def raycluster(name: str, workers: Workers, autoscaling: bool = False, idle_timeout_s: int = 60) -> dict[str, Any]:
    """A RayCluster: the head (no tasks, no GPU) and the GPU worker group; with `autoscaling`, KubeRay's in-tree
    autoscaler as the head's sidecar, scaling idle workers down after `idle_timeout_s`."""
    head_res = {"cpu": "1", "memory": "2Gi"}
    worker_res = {"cpu": "1", "memory": "1Gi"}
    spec: dict[str, Any] = {
        "enableInTreeAutoscaling": autoscaling,
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0", "object-store-memory": OBJECT_STORE_BYTES},  # no tasks on the head
            "template": {"spec": {"volumes": [SHM], "containers": [{
                "name": "ray-head", "image": RAY_IMAGE,
                # The mutating webhook sets this on containers that ask for no GPU; set here so that it holds
                # without the webhook (node-only) too.
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
                "ports": [{"containerPort": 6379, "name": "gcs"}, {"containerPort": 8265, "name": "dashboard"},
                          {"containerPort": 10001, "name": "client"}],
                "volumeMounts": [SHM_MOUNT],
                "resources": {"limits": head_res, "requests": head_res}}]}}},
        "workerGroupSpecs": [{
            "groupName": GROUP, "replicas": workers.replicas, "minReplicas": workers.min_replicas,
            "maxReplicas": workers.max_replicas,
            # KubeRay cannot count GPUs from aliyun.com/* limits: say it here
            "rayStartParams": {"object-store-memory": OBJECT_STORE_BYTES,
                               **({"num-gpus": workers.num_gpus} if workers.num_gpus is not None else {})},
            "template": {"spec": {
                "volumes": [SHM],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{
                    "name": "ray-worker", "image": RAY_IMAGE, "volumeMounts": [SHM_MOUNT],
                    **({"env": [{"name": k, "value": v} for k, v in workers.env]} if workers.env else {}),
                    "resources": {
                        "limits": {**worker_res, MEM: str(workers.mem), CORE: str(workers.core)},
                        "requests": worker_res}}]}}}],
    }
    if autoscaling:
        sidecar = {"cpu": "500m", "memory": "512Mi"}
        spec["autoscalerOptions"] = {"idleTimeoutSeconds": idle_timeout_s,
                                     "resources": {"limits": sidecar, "requests": sidecar}}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name}, "spec": spec}
