"""Keeping a claim's GPUs on one NVLink island in DRA mode: `devplugin dra` publishes each device's `nvlinkIsland`
(devplugin/dra/slices.py), and the example deploy/examples/dra/two-gpus-one-nvlink-island.yaml asks two whole GPUs
with a matchAttribute constraint on it. On the real kube-apiserver and kube-scheduler (1.36, e2e/bin) with the
shipped DeviceClasses and claim policies, on a node of 4 GPUs in two islands of 2 with GPU 1 taken: without the
constraint the scheduler takes GPUs 0 and 2 (first fit, across the islands); with it, GPUs 2 and 3."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from devplugin.gpu.device import GPU
from tests.dra.objects import gpu
from tests.dra.realk8s_dra import DraCluster, pod_with_claims, shipped_dra_cluster, wait_for

pytestmark = pytest.mark.realk8s
EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "examples" / "dra" / "two-gpus-one-nvlink-island.yaml"
NODE = "nvlink-node"


def _gpus() -> list[GPU]:
    return [replace(gpu(i, memory=80 << 30), nvlink_island=i // 2) for i in range(4)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[DraCluster]:
    with shipped_dra_cluster("dra-nvl-", NODE, _gpus) as dc:
        yield dc


def _claim(ns: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def _example_spec(constrained: bool = True) -> dict:
    (template,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == "ResourceClaimTemplate"]
    spec: dict = template["spec"]["spec"]
    if not constrained:
        spec["devices"].pop("constraints")
    return spec


def _allocated(dc: DraCluster, ns: str, claim: dict, pod: str) -> list[str]:
    """Creates `claim` and a pod using it; the devices the scheduler allocated."""
    dc.resource.create_namespaced_resource_claim(ns, claim)
    dc.core.create_namespaced_pod(ns, pod_with_claims(ns, pod, [claim["metadata"]["name"]]))
    assert wait_for(lambda: dc.pod(ns, pod)["spec"].get("nodeName"), f"pod {pod} bound") == NODE
    results = dc.claim(ns, claim["metadata"]["name"])["status"]["allocation"]["devices"]["results"]
    return sorted(r["device"] for r in results)


def test_the_example_keeps_both_gpus_on_one_nvlink_island(cluster: DraCluster) -> None:
    ns = "nvlink"
    cluster.core.create_namespace({"metadata": {"name": ns}})
    cluster.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    slices = cluster.resource.list_resource_slice().items
    islands = {d.name: d.attributes["nvlinkIsland"].int
               for s in slices for d in (s.spec.devices or []) if d.name.endswith("-whole")}
    assert islands == {"gpu-0-whole": 0, "gpu-1-whole": 0, "gpu-2-whole": 1, "gpu-3-whole": 1}

    one = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "whole.gpu.gpushare.io",
        "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpushare.io"].index == 1'}}]}}]}}
    assert _allocated(cluster, ns, _claim(ns, "held", one), "holder") == ["gpu-1-whole"]

    # without the constraint: first fit, one GPU of each island
    assert _allocated(cluster, ns, _claim(ns, "loose", _example_spec(constrained=False)), "loose") == [
        "gpu-0-whole", "gpu-2-whole"]
    cluster.core.delete_namespaced_pod("loose", ns, grace_period_seconds=0)
    loose = cluster.claim(ns, "loose")
    cluster.resource.replace_namespaced_resource_claim_status("loose", ns, {**loose, "status": {}})

    assert _allocated(cluster, ns, _claim(ns, "linked", _example_spec()), "linked") == ["gpu-2-whole", "gpu-3-whole"]
