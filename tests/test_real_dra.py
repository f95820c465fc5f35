"""Dynamic Resource Allocation end to end on the real components (tests/realk8s/dra_cluster.py): a pod's
ResourceClaimTemplate becomes a claim (kube-controller-manager), the claim is allocated a share of a device by
kube-scheduler against the node's ResourceSlice (structured parameters, consumable capacity), the node agent's
DRA manager (the kubelet's own, pkg/kubelet/cm/dra) prepares it through the driver's kubelet plugin, the
container gets the CDI devices the plugin named with the env and mounts of their specs, and when the pod goes the
claim is unprepared, deallocated and deleted."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from tests.realk8s.dra_cluster import DRIVER, MODE_DRA, MODE_LABEL, DraCluster, cdi_specs

pytestmark = pytest.mark.realk8s

GIB = 1024**3
CLASS = "test-share.gpushare.io"


@pytest.fixture(scope="module")
def device_class(dra_cluster: DraCluster) -> str:
    """A DeviceClass of the driver's devices (the shipped ones are checked elsewhere)."""
    dra_cluster.create_resource("deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
    return CLASS


def claim_template(name: str, memory: str, cores: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": CLASS, "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}}}


def pod_with_claim(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {MODE_LABEL: MODE_DRA},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "c0", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}}


def test_template_claim_allocated_prepared_injected_then_freed(dra_cluster: DraCluster, dra_ns: str,
                                                               device_class: str) -> None:
    c = dra_cluster
    c.create_resource("resourceclaimtemplates", claim_template("share", "2Gi", "30"), dra_ns)
    c.core.create_namespaced_pod(dra_ns, pod_with_claim("p", "share"))

    def running() -> k8s.V1Pod | None:
        p = c.core.read_namespaced_pod("p", dra_ns)
        assert p.status.phase != "Failed", (p.status.reason, p.status.message)
        return p if p.status.phase == "Running" else None

    pod = c.wait(running, "pod p Running")
    uid, node = pod.metadata.uid, c.node(pod.spec.node_name)

    # kube-controller-manager generated the claim from the template; kube-scheduler allocated a share of one device
    statuses = pod.status.resource_claim_statuses or []
    assert [s.name for s in statuses] == ["gpu"] and statuses[0].resource_claim_name
    claim = c.resource("resourceclaims", dra_ns, statuses[0].resource_claim_name)
    assert claim["metadata"]["ownerReferences"][0]["uid"] == uid
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == node.name and result["request"] == "gpu"
    assert result["consumedCapacity"] == {"memory": "2Gi", "cores": "30"}
    assert result["shareID"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [uid]

    # the node's DRA manager prepared it through the plugin and holds it for the pod
    (held,) = node.claims()
    assert held["uid"] == claim["metadata"]["uid"] and held["podUIDs"] == [uid]
    (dev,) = held["devices"]
    assert (dev["driver"], dev["pool"], dev["device"], dev["shareID"]) == (
        DRIVER, node.name, result["device"], result["shareID"])
    assert dev["requestNames"] == ["gpu"] and len(dev["cdiDeviceIDs"]) == 1

    # the container got those CDI devices, resolved from the spec the plugin wrote: its env and mounts
    (bpod,) = [p for p in node.books()["pods"] if p["uid"] == uid]
    assert bpod["phase"] == "Running"
    (ctr,) = bpod["containers"]
    assert ctr["cdi"]["cdiDevices"] == dev["cdiDeviceIDs"]
    assert len(ctr["cdi"]["injected"]["specs"]) == 1
    want_env = {"GPUSHARE_DRA_DEVICE": result["device"], "GPUSHARE_DRA_SHARE_ID": result["shareID"],
                "GPUSHARE_DRA_MEMORY": str(2 * GIB), "GPUSHARE_DRA_CORES": "30",
                "GPUSHARE_DRA_CLAIM": f"{dra_ns}/{claim['metadata']['name']}"}
    assert ctr["cdi"]["injected"]["env"] == want_env
    assert {k: ctr["envs"][k] for k in want_env} == want_env
    (mount,) = ctr["cdi"]["injected"]["mounts"]
    assert mount["containerPath"] == "/etc/gpushare-dra/0"
    assert open(mount["hostPath"]).read() == result["device"] + "\n"

    # the pod goes: the agent unprepares (the spec is gone), KCM deallocates and deletes the generated claim
    c.core.delete_namespaced_pod("p", dra_ns)
    c.wait(lambda: not node.claims(), "the claim unprepared on the node")
    assert not any(claim["metadata"]["uid"] in str(s) for s in cdi_specs(node))

    def claim_gone() -> bool:
        try:
            c.resource("resourceclaims", dra_ns, claim["metadata"]["name"])
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    c.wait(claim_gone, "the generated claim deleted")
