"""Choosing GPUs by model and UUID in DRA mode: CEL selectors on the `productName` and `uuid` attributes
`devplugin dra` publishes (devplugin/dra/slices.py), on the real kube-apiserver and kube-scheduler (1.36, e2e/bin)
with the shipped DeviceClasses and claim policies. The example deploy/examples/dra/h100-not-this-gpu.yaml takes
an H100 other than the one it names, on a node of two A100s and two H100s; a claim for a model the node lacks is
not allocated, and the pod stays unscheduled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devplugin.gpu.device import GPU
from tests.dra.realk8s_dra import DraCluster, pod_with_claims, shipped_dra_cluster, wait_for

pytestmark = pytest.mark.realk8s
REPO = Path(__file__).resolve().parents[3]
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
EXAMPLE = REPO / "deploy" / "examples" / "dra" / "h100-not-this-gpu.yaml"
COMPONENT = REPO / "deploy" / "components" / "dra"
NODE = "mixed-node"
GiB = 1 << 30
AVOIDED = "GPU-5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90"  # the UUID the example avoids
MODELS = ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]
UUIDS = ["GPU-0a000000-0000-4000-8000-000000000000", "GPU-0a000000-0000-4000-8000-000000000001", AVOIDED,
         "GPU-0b000000-0000-4000-8000-000000000003"]


def _gpus() -> list[GPU]:
    return [GPU(index=i, uuid=UUIDS[i], name=MODELS[i], memory_bytes=80 * GiB, minor=i,
                pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=0) for i in range(4)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[DraCluster]:
    with shipped_dra_cluster("dra-sel-", NODE, _gpus) as dc:
        yield dc


def _namespace(dc: DraCluster, ns: str) -> None:
    dc.core.create_namespace({"metadata": {"name": ns}})
    dc.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})


def _claim_from_example(ns: str, name: str, selectors: list[dict] | None = None) -> dict:
    """The example's template as the resourceclaim controller would make its claim (optionally other selectors)."""
    (template,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == "ResourceClaimTemplate"]
    spec = template["spec"]["spec"]
    if selectors is not None:
        spec["devices"]["requests"][0]["exactly"]["selectors"] = selectors
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def test_the_example_takes_an_h100_other_than_the_one_it_avoids(cluster: DraCluster) -> None:
    _namespace(cluster, "h100")
    cluster.resource.create_namespaced_resource_claim("h100", _claim_from_example("h100", "gpu"))
    cluster.core.create_namespaced_pod("h100", pod_with_claims("h100", "p", ["gpu"]))
    assert wait_for(lambda: cluster.pod("h100", "p")["spec"].get("nodeName"), "pod p bound") == NODE
    claim = cluster.claim("h100", "gpu")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["device"], r.get("consumedCapacity")) for r in results] == [("gpu-3", {"memory": "4Gi",
                                                                                      "cores": "30"})]


def test_a_model_the_node_lacks_leaves_the_claim_unallocated_and_the_pod_unscheduled(cluster: DraCluster) -> None:
    _namespace(cluster, "v100")
    v100 = [{"cel": {"expression": 'device.attributes["gpu.gpushare.io"].productName.lowerAscii().contains("v100")'}}]
    cluster.resource.create_namespaced_resource_claim("v100", _claim_from_example("v100", "gpu", v100))
    cluster.core.create_namespaced_pod("v100", pod_with_claims("v100", "p", ["gpu"]))

    def unschedulable() -> str:
        for cond in cluster.pod("v100", "p").get("status", {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message", ""))
        return ""

    why = wait_for(unschedulable, "pod p unschedulable")
    assert "cannot allocate all claims" in why, why
    assert not cluster.pod("v100", "p")["spec"].get("nodeName")
    assert not cluster.claim("v100", "gpu").get("status", {}).get("allocation")


def test_a_uuid_list_takes_only_the_gpus_it_names(cluster: DraCluster) -> None:
    _namespace(cluster, "uuid")
    only = [{"cel": {"expression": f'device.attributes["gpu.gpushare.io"].uuid in ["{UUIDS[1]}"]'}}]
    cluster.resource.create_namespaced_resource_claim("uuid", _claim_from_example("uuid", "gpu", only))
    cluster.core.create_namespaced_pod("uuid", pod_with_claims("uuid", "p", ["gpu"]))
    assert wait_for(lambda: cluster.pod("uuid", "p")["spec"].get("nodeName"), "pod p bound") == NODE
    results = cluster.claim("uuid", "gpu")["status"]["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-1"]
