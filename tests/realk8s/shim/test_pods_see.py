"""What a pod sees of its GPUs, from inside its running container (the workload probe: NVML, NVIDIA's CUDA
runtime, nvidia-smi, the shim's limits file), on the real cluster: a share sees exactly its slice, whole GPUs are
whole, and a container granted no GPU sees none, whatever a tenant writes in its pod."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client as k8s

from tests.realk8s.cluster import Cluster
from tests.realk8s.images import CUDA_IMAGE, WORKLOAD_IMAGE
from tests.realk8s.inside import GiB, View, sees_no_gpu, sees_slice
from tests.realk8s.podspecs import Ask, pod, settled_and_recorded, wait_pods

pytestmark = pytest.mark.realk8s


def running(cluster: Cluster, ns: str, name: str) -> dict:
    pods = wait_pods(cluster.core, ns, lambda ps: any(p.metadata.name == name and settled_and_recorded(p) for p in ps),
                     f"{name} Running with its record")
    p = next(p for p in pods if p.metadata.name == name)
    assert p.status.phase == "Running", (p.status.phase, p.status.message)
    return dict(json.loads((p.metadata.annotations or {}).get("gpushare.io/allocated", "{}")))


def granted(record: dict, container: str) -> list[str]:
    return [s["uuid"] for s in record["containers"][container]]


def test_a_share_sees_exactly_its_slice_in_nvml_the_runtime_and_nvidia_smi(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, pod("share", [Ask(mem=4, core=30)]))
    rec = running(realk8s, ns, "share")
    view = View(realk8s.probe(ns, "share", "c0"))
    assert sees_slice(view, granted(rec, "c0"), 4 * GiB, 30) == []
    assert view.env["CUDA_DEVICE_SM_LIMIT"] == "30"


def test_two_containers_of_one_pod_each_see_their_own_slice(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, pod("two", [Ask(mem=6, core=20), Ask(mem=2, core=10)]))
    rec = running(realk8s, ns, "two")
    assert sees_slice(View(realk8s.probe(ns, "two", "c0")), granted(rec, "c0"), 6 * GiB, 20) == []
    assert sees_slice(View(realk8s.probe(ns, "two", "c1")), granted(rec, "c1"), 2 * GiB, 10) == []


def test_a_multi_gpu_share_sees_its_part_on_each_gpu(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, pod("multi", [Ask(mem=16, core=40)], labels={"aliyun.com/gpu-count": "2"}))
    rec = running(realk8s, ns, "multi")
    uuids = granted(rec, "c0")
    assert len(uuids) == 2
    assert sees_slice(View(realk8s.probe(ns, "multi", "c0")), uuids, 8 * GiB, 20) == []


def test_whole_gpus_are_seen_whole_without_a_cap(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, pod("whole", [Ask(count=2)]))
    rec = running(realk8s, ns, "whole")
    view = View(realk8s.probe(ns, "whole", "c0"))
    assert sorted(view.nvml_uuids) == sorted(granted(rec, "c0"))
    assert view.nvml_totals == [realk8s.spec.gpu_mib << 20] * 2
    assert view.runtime_total == realk8s.spec.gpu_mib << 20


def cpu_pod(name: str, labels: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict:
    """A pod of NVIDIA's CUDA image (NVIDIA_VISIBLE_DEVICES=all in its ENV) that asks for no GPU."""
    body = pod(name, [Ask()], labels=labels)
    body["spec"]["containers"][0]["image"] = WORKLOAD_IMAGE
    if limits:
        body["spec"]["containers"][0]["resources"] = {"limits": limits, "requests": limits}
    return body


def test_a_cpu_pod_of_the_cuda_image_sees_no_gpu(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, cpu_pod("cpu"))
    running(realk8s, ns, "cpu")
    view = View(realk8s.probe(ns, "cpu", "c0"))
    assert view.env.get("NVIDIA_VISIBLE_DEVICES") != "all"
    assert sees_no_gpu(view) == []


@pytest.mark.parametrize("limits", [{"nvidia.com/gpu": "0"}, {"aliyun.com/gpu-mem": "0"}, {"example.com/gpu-x": "0"}],
                         ids=["nvidia-gpu-0", "gpu-mem-0", "other-gpu-0"])
def test_a_zero_gpu_request_does_not_show_a_cpu_pod_every_gpu(realk8s: Cluster, ns: str, limits: dict) -> None:
    """A zero quantity makes no device plugin call and sets no env: the container is a CPU container."""
    realk8s.core.create_namespaced_pod(ns, cpu_pod("zero", limits=limits))
    running(realk8s, ns, "zero")
    assert sees_no_gpu(View(realk8s.probe(ns, "zero", "c0"))) == []


def test_a_pod_label_does_not_show_a_cpu_pod_every_gpu(realk8s: Cluster, ns: str) -> None:
    """The pod is the tenant's own: no label of it can opt its containers out of the void."""
    realk8s.core.create_namespaced_pod(ns, cpu_pod("keep", labels={"gpushare.io/visible-devices": "keep"}))
    running(realk8s, ns, "keep")
    assert sees_no_gpu(View(realk8s.probe(ns, "keep", "c0"))) == []


def test_a_cpu_container_beside_a_gpu_container_sees_no_gpu(realk8s: Cluster, ns: str) -> None:
    body = pod("mixed", [Ask(mem=4, core=20, name="gpu"), Ask(name="cpu")])
    body["spec"]["containers"][1]["image"] = CUDA_IMAGE
    body["spec"]["containers"][1]["command"] = ["python", "/opt/gpushare-test/probe.py"]
    realk8s.core.create_namespaced_pod(ns, body)
    rec = running(realk8s, ns, "mixed")
    assert sees_slice(View(realk8s.probe(ns, "mixed", "gpu")), granted(rec, "gpu"), 4 * GiB, 20) == []
    assert sees_no_gpu(View(realk8s.probe(ns, "mixed", "cpu"))) == []


def test_where_the_toolkit_takes_the_env_the_webhooks_void_keeps_cpu_pods_blind(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """A node whose container toolkit keeps its defaults (the env names the GPUs, envvar grants): a GPU pod sees
    its slice through its env, a CPU pod of the CUDA image sees nothing whatever it writes in its pod, and when the
    mutating webhook did not run (here: removed by an admin) the webhook that fails closed refuses the CPU pod
    rather than let it start unvoided."""
    cluster = make_cluster(nodes=1, gpus=2, gpu_mib=16 * 1024, toolkit_volume_mounts=False)
    ns = cluster.namespace()
    cluster.core.create_namespaced_pod(ns, pod("share", [Ask(mem=4, core=30)]))
    for body in (cpu_pod("cpu"), cpu_pod("zero", limits={"nvidia.com/gpu": "0"}),
                 cpu_pod("keep", labels={"gpushare.io/visible-devices": "keep"})):
        cluster.core.create_namespaced_pod(ns, body)
    rec = running(cluster, ns, "share")
    view = View(cluster.probe(ns, "share", "c0"))
    assert view.env["NVIDIA_VISIBLE_DEVICES"] == granted(rec, "c0")[0]  # the envvar grant
    assert sees_slice(view, granted(rec, "c0"), 4 * GiB, 30) == []
    for name in ("cpu", "zero", "keep"):
        running(cluster, ns, name)
        seen = View(cluster.probe(ns, name, "c0"))
        assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "void", name
        assert sees_no_gpu(seen) == [], name
    admission = k8s.AdmissionregistrationV1Api(cluster.api_client)
    admission.delete_mutating_webhook_configuration("devplugin-scheduler")
    deadline = time.monotonic() + 30
    while True:  # the apiserver's webhook configuration cache follows the deletion within a moment
        try:
            cluster.core.create_namespaced_pod(ns, cpu_pod(f"unvoided-{int(time.monotonic() * 1000) % 100000}"))
        except k8s.ApiException as exc:
            why = json.loads(exc.body)["message"]
            break
        assert time.monotonic() < deadline, "a CPU pod was still created unvoided 30 s after the mutating webhook went"
        time.sleep(0.5)
    assert 'admission webhook "void.gpushare.io" denied the request' in why, why
    assert "asks for no GPU but is not marked NVIDIA_VISIBLE_DEVICES=void" in why, why
