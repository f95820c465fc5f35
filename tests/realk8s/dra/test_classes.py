"""The shipped DeviceClasses and example claims (deploy/components/dra, deploy/examples/dra) on the real
kube-apiserver and kube-scheduler (1.36, e2e/bin) against the slices `devplugin dra` publishes
(devplugin/dra/slices.py; one node, three 80 GiB GPUs), with the claim policies installed: each example's pod is
scheduled and its claim gets what the example says: a 4 GiB / 30 % share of GPU 0 (first fit), a whole GPU, one
6 GiB / 50 % allocation for two containers, shares on two different GPUs, the share choice of a firstAvailable
request; and what docs/guide/dra.md says of count and of two claims (count 2: two GPUs; two claims: maybe one GPU).
The examples' templates become claims here as kube-controller-manager's resourceclaim controller would
make them (the spec copied, named after the pod); each example starts on free GPUs."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devplugin.gpu.device import GPU
from tests.dra.realk8s_dra import DraCluster, shipped_dra_cluster, wait_for

pytestmark = pytest.mark.realk8s
REPO = Path(__file__).resolve().parents[3]
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
EXAMPLES = REPO / "deploy" / "examples" / "dra"
COMPONENT = REPO / "deploy" / "components" / "dra"
NODE = "gpu-node"
GiB = 1 << 30


def _gpus() -> list[GPU]:
    return [GPU(index=i, uuid=f"GPU-{NODE}-{i}", name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * GiB, minor=i,
                pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=0) for i in range(3)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[DraCluster]:
    with shipped_dra_cluster("dra-cls-", NODE, _gpus) as dc:
        yield dc


def _run_example(dc: DraCluster, ns: str, file: str) -> tuple[dict, dict[str, dict]]:
    """Create the example's objects in `ns` (a Deployment as one of its pods, templates as the controller's
    claims); returns (the pod once bound, its claims by the pod's claim name)."""
    dc.core.create_namespace({"metadata": {"name": ns}})
    dc.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    docs = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d]
    templates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ResourceClaimTemplate"}
    for d in docs:
        if d["kind"] == "ResourceClaim":
            dc.resource.create_namespaced_resource_claim(ns, d)
    (workload,) = [d for d in docs if d["kind"] in ("Pod", "Deployment")]
    if workload["kind"] == "Deployment":
        template = workload["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{workload['metadata']['name']}-0",
                                                               "labels": template["metadata"]["labels"]},
               "spec": copy.deepcopy(template["spec"])}
    else:
        pod = copy.deepcopy(workload)
    name = pod["metadata"]["name"]
    for ref in pod["spec"]["resourceClaims"]:
        if "resourceClaimTemplateName" in ref:  # what the resourceclaim controller does
            claim_name = f"{name}-{ref['name']}"
            dc.resource.create_namespaced_resource_claim(ns, {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": claim_name, "namespace": ns},
                "spec": templates[ref.pop("resourceClaimTemplateName")]["spec"]["spec"]})
            ref["resourceClaimName"] = claim_name
    dc.core.create_namespaced_pod(ns, pod)
    bound = wait_for(lambda: dc.pod(ns, name)["spec"].get("nodeName"), f"{file}: pod {name} bound")
    assert bound == NODE
    claims = {ref["name"]: dc.claim(ns, ref["resourceClaimName"]) for ref in pod["spec"]["resourceClaims"]}
    for c in claims.values():
        dc.resource.replace_namespaced_resource_claim_status(c["metadata"]["name"], ns, {**c, "status": {}})
    return dc.pod(ns, name), claims  # claims as allocated; freed again for the next example


def _results(claim: dict) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in ("request", "device", "consumedCapacity")}
            for r in claim["status"]["allocation"]["devices"]["results"]]


def test_a_share_of_4gi_and_30_percent_takes_gpu_0_first(cluster: DraCluster) -> None:
    _, claims = _run_example(cluster, "share", "share-4gi-30.yaml")
    assert _results(claims["gpu"]) == [{"request": "gpu", "device": "gpu-0",
                                        "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]


def test_a_whole_gpu_takes_an_exclusive_device(cluster: DraCluster) -> None:
    _, claims = _run_example(cluster, "whole", "whole-gpu.yaml")
    ((result,),) = [claims["gpu"]["status"]["allocation"]["devices"]["results"]]
    assert result["device"] == "gpu-0-whole" and "shareID" not in result and "consumedCapacity" not in result


def test_one_claim_two_containers_one_allocation(cluster: DraCluster) -> None:
    pod, claims = _run_example(cluster, "two-containers", "shared-by-two-containers.yaml")
    assert [c["resources"]["claims"] for c in pod["spec"]["containers"]] == [[{"name": "gpu"}], [{"name": "gpu"}]]
    assert _results(claims["gpu"]) == [{"request": "gpu", "device": "gpu-0",
                                        "consumedCapacity": {"memory": "6Gi", "cores": "50"}}]
    assert [r["name"] for r in claims["gpu"]["status"]["reservedFor"]] == ["two-containers-one-share"]


def test_two_requests_with_distinct_uuids_land_on_two_gpus(cluster: DraCluster) -> None:
    _, claims = _run_example(cluster, "two-gpus", "two-gpus.yaml")
    assert _results(claims["gpus"]) == [
        {"request": "train", "device": "gpu-0", "consumedCapacity": {"memory": "8Gi", "cores": "50"}},
        {"request": "infer", "device": "gpu-1", "consumedCapacity": {"memory": "4Gi", "cores": "30"}}]


def test_a_deployment_replica_takes_the_share_of_its_first_available_choice(cluster: DraCluster) -> None:
    _, claims = _run_example(cluster, "deployment", "deployment.yaml")
    assert _results(claims["gpu"]) == [{"request": "gpu/share", "device": "gpu-0",
                                        "consumedCapacity": {"memory": "2Gi", "cores": "20"}}]




def _share(name: str, memory: str, cores: str, count: int = 1) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.gpushare.io", "count": count,
                "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}}


def _pod_with(dc: DraCluster, ns: str, claims: list[dict]) -> list[dict]:
    """The claims and a pod using them in a new namespace `ns`; the claims as allocated once the pod is bound,
    then freed for the next test."""
    dc.core.create_namespace({"metadata": {"name": ns}})
    dc.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    for c in claims:
        dc.resource.create_namespaced_resource_claim(ns, c)
    refs = [{"name": f"c{i}", "resourceClaimName": c["metadata"]["name"]} for i, c in enumerate(claims)]
    dc.core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "main"}, "spec": {
        "resourceClaims": refs, "containers": [{"name": "main", "image": "busybox",
                                                "resources": {"claims": [{"name": r["name"]} for r in refs]}}]}})
    wait_for(lambda: dc.pod(ns, "main")["spec"].get("nodeName"), f"{ns}: pod bound")
    out = [dc.claim(ns, c["metadata"]["name"]) for c in claims]
    for c in out:
        dc.resource.replace_namespaced_resource_claim_status(c["metadata"]["name"], ns, {**c, "status": {}})
    return out


def _devices(claim: dict) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def test_count_2_gives_two_shares_on_two_gpus(cluster: DraCluster) -> None:
    (claim,) = _pod_with(cluster, "count", [_share("two", "2Gi", "20", count=2)])
    assert _devices(claim) == ["gpu-0", "gpu-1"]


def test_two_claims_of_one_pod_may_share_one_gpu(cluster: DraCluster) -> None:
    """Why two-gpus.yaml uses one claim with a constraint: constraints do not reach across claims."""
    first, second = _pod_with(cluster, "two-claims", [_share("a", "2Gi", "20"), _share("b", "2Gi", "20")])
    assert _devices(first) == _devices(second) == ["gpu-0"]
