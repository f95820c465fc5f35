"""The project's admission webhooks as the real kube-apiserver calls them (registered by the shipped manifests,
at the loopback URL): each rule denies with its message, a valid GPU pod runs, the mutating webhook hides the
GPUs from CPU containers; with the service down, pods are refused (fail closed) except in kube-system. What each
pod created sees from inside (tests/realk8s/inside.py) is what it asked for: a valid GPU pod's container its slice,
capped at it with the CUDA runtime's and CuPy's own out-of-memory errors and running a cuBLAS GEMM under the shim;
a CPU container of NVIDIA's CUDA image no GPU at all."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s

from tests.realk8s.cluster import Cluster
from tests.realk8s.images import CUDA_IMAGE, TOOLS_IN_IMAGE
from tests.realk8s.inside import CONTEXT_CHARGE, GiB, pod_sees_what_it_was_given
from tests.realk8s.podspecs import Ask, pod, settled_and_recorded, wait_pods

pytestmark = pytest.mark.realk8s


def refused(cluster: Cluster, ns: str, body: dict) -> str:
    """Create the pod; return the apiserver's refusal message (fails if the pod was created)."""
    try:
        cluster.core.create_namespaced_pod(ns, body)
    except k8s.ApiException as exc:
        return str(json.loads(exc.body).get("message", exc.body))
    raise AssertionError(f"pod {body['metadata']['name']} was created; a refusal was expected")


DENIED = [
    ("core-not-step", [Ask(mem=4, core=33)], {},
     "gpu-core.percentage 33 is not a valid compute share; ask for a multiple of 5"),
    ("core-without-mem", [Ask(core=30)], {}, "gpu-core.percentage needs gpu-mem; add a gpu-mem limit"),
    ("larger-than-gpu", [Ask(mem=81)], {},
     "asks for 81 gpu-mem units but the largest GPU in the cluster has 80; ask for at most 80"),
    ("uneven-multi-gpu", [Ask(mem=6)], {"aliyun.com/gpu-count": "4"}, "do not split evenly over 4 GPUs"),
    ("count-with-share", [Ask(mem=4, count=1)], {}, "gpu-count (whole GPUs) cannot be combined with gpu-mem"),
    ("reserved-env", [Ask(mem=4, env=(("LD_PRELOAD", "/x.so"),))], {}, "sets env LD_PRELOAD"),
    ("multi-gpu-not-number", [Ask(mem=8)], {"aliyun.com/gpu-count": "two"}, "is not a whole number"),
]


@pytest.mark.parametrize(("name", "asks", "labels", "message"), DENIED, ids=[d[0] for d in DENIED])
def test_validating_webhook_denies_each_rule_with_its_message(realk8s: Cluster, ns: str, name: str,
                                                             asks: list[Ask], labels: dict, message: str) -> None:
    why = refused(realk8s, ns, pod(name, asks, labels=labels))
    assert 'admission webhook "validate.gpushare.io" denied the request' in why
    assert message in why, why
    assert realk8s.core.list_namespaced_pod(ns).items == []


def test_requests_that_differ_from_limits_are_refused_by_the_apiserver_first(realk8s: Cluster, ns: str) -> None:
    """Extended resources must have requests equal to limits: the apiserver's own validation says so before any
    validating webhook is called (the webhook's rule for it is a second line for other API paths)."""
    body = pod("req-neq-limit", [Ask(mem=4)])
    body["spec"]["containers"][0]["resources"]["requests"] = {"aliyun.com/gpu-mem": "2"}
    why = refused(realk8s, ns, body)
    assert "aliyun.com/gpu-mem" in why and "must be equal to" in why, why


def cuda_image(body: dict, container: int = 0) -> dict:
    """The container runs NVIDIA's CUDA image (NVIDIA_VISIBLE_DEVICES=all in its ENV, `sleep infinity`)."""
    body["spec"]["containers"][container]["image"] = CUDA_IMAGE
    return body


def steps(result: dict) -> dict[str, list[dict]]:
    """A probe's JSON steps (rt_probe.cu, cupy_probe.py) from an exec's output, by op."""
    out: dict[str, list[dict]] = {}
    for line in result["stdout"].splitlines():
        if line.startswith('{"op"'):
            step = json.loads(line)
            out.setdefault(step["op"], []).append(step)
    return out


def test_a_valid_gpu_pod_runs_on_the_gpu_recorded_and_cpu_containers_see_no_gpu(realk8s: Cluster, ns: str) -> None:
    body = cuda_image(pod("ok", [Ask(mem=2, core=30, name="gpu"), Ask(name="cpu")]), 1)
    realk8s.core.create_namespaced_pod(ns, body)
    [p] = wait_pods(realk8s.core, ns, lambda ps: all(settled_and_recorded(x) for x in ps), "Running and recorded",
                    timeout=60)
    assert p.status.phase == "Running", p.status
    envs = {c.name: {e.name: e.value for e in c.env or []} for c in p.spec.containers}
    assert envs["cpu"].get("NVIDIA_VISIBLE_DEVICES") == "void"  # the mutating webhook
    assert "NVIDIA_VISIBLE_DEVICES" not in envs["gpu"]
    record = json.loads(p.metadata.annotations["gpushare.io/allocated"])
    [share] = record["containers"]["gpu"]
    assert (share["mem"], share["core"], record["node"]) == (2, 30, p.spec.node_name)
    scheduled = json.loads(p.metadata.annotations["gpushare.io/scheduled"])
    assert scheduled["containers"]["gpu"][0]["index"] == share["index"]
    assert pod_sees_what_it_was_given(realk8s, p) == []  # its 2 GiB / 30 % slice; the CPU container no GPU

    # the cap, reached with NVIDIA's runtime's own error: after its context's charge, seven 256 MiB allocations fill
    # the 2 GiB slice and the eighth is cudaErrorMemoryAllocation
    rt = realk8s.exec(ns, "ok", "gpu", [f"{TOOLS_IN_IMAGE}/rt_probe_static", "init", "meminfo", "fill", "256",
                                        "meminfo"])
    got = steps(rt)
    assert rt["exitCode"] == 0 and got["init"][0]["error"] == "cudaSuccess", rt
    assert (got["meminfo"][0]["total"], got["meminfo"][0]["free"]) == (2 * GiB, 2 * GiB - CONTEXT_CHARGE), rt
    assert (got["fill"][0]["count"], got["fill"][0]["error"]) == (7, "cudaErrorMemoryAllocation"), rt
    assert got["meminfo"][1]["free"] == 0, rt
    # and with CuPy's: OutOfMemoryError at the slice; everything given back, a cuBLAS GEMM runs under the shim
    cupy = realk8s.exec(ns, "ok", "gpu", ["python", f"{TOOLS_IN_IMAGE}/cupy_probe.py", "init", "fill", "256",
                                          "freeall", "meminfo", "gemm", "512"], timeout=180)
    got = steps(cupy)
    assert cupy["exitCode"] == 0 and "init" in got, cupy
    assert (got["fill"][0]["count"], got["fill"][0]["error"]) == (7, "OutOfMemoryError"), cupy
    assert "out of memory" in got["fill"][0]["message"].lower(), cupy
    assert got["meminfo"][0]["free"] == 2 * GiB - CONTEXT_CHARGE, cupy
    gemm = got["gemm"][0]
    assert gemm["ok"] and gemm["shape"] == [512, 512], cupy


def test_service_down_pods_refused_except_in_kube_system(realk8s: Cluster, ns: str) -> None:
    """The validating webhook fails closed and sees every pod (any container could set NVIDIA_VISIBLE_DEVICES
    itself): while the service is down no pod is created outside kube-system, which both webhooks leave out so
    the control plane can always start."""
    ext = realk8s.procs["devplugin-scheduler"]
    ext.stop()
    try:
        try:
            for name, asks in (("gpu-while-down", [Ask(mem=4)]), ("cpu-while-down", [Ask()])):
                why = refused(realk8s, ns, pod(name, asks))
                # either webhook that fails closed may answer first: the apiserver calls them in parallel
                assert ('failed calling webhook "validate.gpushare.io"' in why
                        or 'failed calling webhook "void.gpushare.io"' in why), why
            realk8s.core.create_namespaced_pod("kube-system", cuda_image(pod("system-while-down", [Ask()])))
            system = realk8s.core.read_namespaced_pod("system-while-down", "kube-system")
            assert not any(e.name == "NVIDIA_VISIBLE_DEVICES" for e in system.spec.containers[0].env or [])
        finally:
            realk8s.start_extender()
        realk8s.core.create_namespaced_pod(ns, pod("gpu-after", [Ask(mem=4)]))
        realk8s.core.create_namespaced_pod(ns, cuda_image(pod("cpu-after", [Ask()])))
        after = wait_pods(realk8s.core, ns, lambda ps: len(ps) == 2 and all(settled_and_recorded(x) for x in ps),
                          "Running and recorded", timeout=60)
        [system] = [p for p in wait_pods(realk8s.core, "kube-system", lambda ps: any(
            x.metadata.name == "system-while-down" and x.status.phase == "Running" for x in ps),
            "system-while-down Running", timeout=60) if p.metadata.name == "system-while-down"]
        # the webhooks left the kube-system pod unvoided (NVIDIA_VISIBLE_DEVICES=all from its image): the nodes'
        # toolkit takes no grant from an env, so it sees no GPU either; the GPU pod sees its 4 GiB, all the
        # compute nobody reserved on its GPU
        unreserved = {"gpu-after": {"c0": 100}}
        assert [bad for p in [*after, system]
                for bad in pod_sees_what_it_was_given(realk8s, p, unreserved.get(p.metadata.name))] == []
    finally:
        try:
            realk8s.core.delete_namespaced_pod("system-while-down", "kube-system", grace_period_seconds=0)
        except k8s.ApiException:
            pass
