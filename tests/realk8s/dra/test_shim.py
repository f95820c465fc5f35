"""The shim enforces a DRA claim's share (tests/realk8s/dra_cluster.py): a pod's claim goes through
kube-controller-manager, kube-scheduler, the node agent's DRA manager and `devplugin dra`, the container gets the
env and mounts of the CDI device the plugin named, and real CUDA clients (tests/cuda/rt_probe.cu on NVIDIA's
runtime, the shim's gs_probe) run with exactly that env over the node's fake driver, each mount's host path
standing in for its path in the container. What a user relies on: the device is the claim's memory, allocations
stop at it with the runtime's own error, the compute share is the claim's cores, and the containers of a pod that
share one claim share one budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devplugin import contract
from tests.realk8s.dra.test_end_to_end import claim_template, pod_with_claim, running_pod
from tests.realk8s.dra_cluster import DraCluster, DraNode
from tests.support import cuda_runtime, shim_probe

pytestmark = pytest.mark.realk8s

GiB, MiB = 1 << 30, 1 << 20
OOM = "cudaErrorMemoryAllocation"


def cdi_containers(node: DraNode, uid: str) -> dict[str, dict[str, Any]]:
    """What the node agent's books say each container of the pod got from CDI: {"env": ..., "mounts": {container
    path: host path}}."""
    (bpod,) = [p for p in node.books()["pods"] if p["uid"] == uid]
    return {ctr["name"]: {"env": ctr["cdi"]["injected"]["env"],
                          "mounts": {m["containerPath"]: m["hostPath"] for m in ctr["cdi"]["injected"]["mounts"]}}
            for ctr in bpod["containers"]}


def container_env(node: DraNode, tmp: Path, got: dict[str, Any]) -> dict[str, str]:
    """A process of that container on the node's fake driver: the CDI env as given, with a container path in a
    value replaced by its mount's host path, the shim preloaded from the library mount, and the limits file and
    the node's GPU locks, which the shim finds at fixed container paths, named by their host paths. The runtime
    of a real container shows it only NVIDIA_VISIBLE_DEVICES' GPUs; CUDA_VISIBLE_DEVICES does it here."""
    assert node.driver is not None
    env, mounts = got["env"], got["mounts"]
    settings = {k: mounts.get(v, v) for k, v in env.items()}
    settings.update({
        "LD_PRELOAD": mounts[contract.CONTAINER_LIB_PATH],
        contract.ENV_LIMITS_FILE: mounts[contract.CONTAINER_LIMITS_PATH],
        contract.ENV_SHARED_CACHE: mounts[contract.CONTAINER_SHARED_CACHE],
        contract.ENV_GPU_LOCK_DIR: mounts[contract.CONTAINER_GPU_LOCK_DIR],
        "CUDA_VISIBLE_DEVICES": env[contract.ENV_NVIDIA_VISIBLE_DEVICES],
    })
    return shim_probe.Node(node.driver, tmp).env(**settings)


def two_container_pod(name: str, template: str) -> dict[str, Any]:
    body = pod_with_claim(name, template)
    (ctr,) = body["spec"]["containers"]
    body["spec"]["containers"] = [ctr, {**ctr, "name": "c1"}]
    return body


def test_a_claims_share_is_what_a_cuda_client_under_the_shim_gets(dra_cluster: DraCluster, dra_ns: str,
                                                                  tmp_path: Path) -> None:
    c = dra_cluster
    c.create_resource("resourceclaimtemplates", claim_template("share", "2Gi", "30"), dra_ns)
    c.core.create_namespaced_pod(dra_ns, pod_with_claim("p", "share"))
    pod = running_pod(c, dra_ns, "p")
    node = c.node(pod.spec.node_name)
    got = cdi_containers(node, pod.metadata.uid)["c0"]
    mounts = got["mounts"]
    # the mounts deliver the shim: its library, the preload file naming it, the claim's limits and accounting file
    assert Path(mounts[contract.CONTAINER_PRELOAD_PATH]).read_text().split() == [contract.CONTAINER_LIB_PATH]
    assert contract.parse_limits(Path(mounts[contract.CONTAINER_LIMITS_PATH]).read_text()).devices == (
        contract.DeviceLimit(got["env"][contract.ENV_NVIDIA_VISIBLE_DEVICES], 2 * GiB, 30),)
    env = container_env(node, tmp_path, got)

    # NVIDIA's runtime: the device is 2 GiB (as nvidia-smi's NVML shows too); the 9th 256 MiB allocation is refused
    r = cuda_runtime.run(cuda_runtime.runtime_probe("static"), env, "init", "meminfo", "nvml", "fill", 256,
                         "meminfo")
    assert r.step("init")["error"] == "cudaSuccess"
    assert (r.step("meminfo")["total"], r.step("meminfo")["free"]) == (2 * GiB, 2 * GiB)
    assert r.step("nvml")["nvml_rc"] == 0 and (r.step("nvml")["total"], r.step("nvml")["free"]) == (2 * GiB, 2 * GiB)
    assert (r.step("fill")["count"], r.step("fill")["error"]) == (8, OOM)
    assert r.step("meminfo", 1)["free"] == 0

    # the driver API through the shim: an allocation beyond the share fails with CUDA_ERROR_OUT_OF_MEMORY, and the
    # compute share the shim holds the GPU's launches to is the claim's 30 cores
    steps = shim_probe.run(env, "init", "ctx", 0, "alloc", "2049m", "stats", 0)
    assert steps[2]["rc"] == shim_probe.CUDA_ERROR_OUT_OF_MEMORY, steps
    assert (steps[3]["shim"], steps[3]["active"], steps[3]["sm_limit"]) == (True, 1, 30), steps


def test_two_containers_of_a_pod_sharing_a_claim_share_one_budget(dra_cluster: DraCluster, dra_ns: str,
                                                                   tmp_path: Path) -> None:
    c = dra_cluster
    c.create_resource("resourceclaimtemplates", claim_template("share", "2Gi", "30"), dra_ns)
    c.core.create_namespaced_pod(dra_ns, two_container_pod("p", "share"))
    pod = running_pod(c, dra_ns, "p")
    node = c.node(pod.spec.node_name)
    got = cdi_containers(node, pod.metadata.uid)
    assert sorted(got) == ["c0", "c1"]
    # the same CDI device: the same GPU, one limits file, one accounting file
    assert got["c0"] == got["c1"]
    assert got["c0"]["env"][contract.ENV_MEMORY_LIMIT + "_0"] == "2048m"

    probe = cuda_runtime.runtime_probe("static")
    first = cuda_runtime.start(probe, container_env(node, tmp_path / "c0", got["c0"]), "init", "alloc", 1536,
                               "ready")
    try:
        assert cuda_runtime.until(first, "ready")[1]["error"] == "cudaSuccess"
        r = cuda_runtime.run(probe, container_env(node, tmp_path / "c1", got["c1"]), "init", "meminfo", "fill", 256)
        assert (r.step("meminfo")["total"], r.step("meminfo")["free"]) == (2 * GiB, 512 * MiB)
        assert (r.step("fill")["count"], r.step("fill")["error"]) == (2, OOM)
    finally:
        first.communicate("\n", timeout=30)
    assert first.returncode == 0
