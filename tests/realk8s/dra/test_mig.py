"""DRA on a node with a GPU in MIG mode, end to end (tests/realk8s/dra_cluster.py: kube-controller-manager,
kube-scheduler, the node agent's DRA manager, `devplugin dra` over the fake driver in MIG mode, pods run with
runc): a claim that selects the 1g.10gb profile with CEL is prepared in that MIG device, and from inside its
running container NVIDIA's CUDA runtime sees the 2 GiB slice through the MIG device's UUID."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from devplugin import contract
from devplugin_sim.mig_layouts import mig_node
from tests.realk8s.dra_cluster import MODE_DRA, MODE_LABEL, SHARE_CLASS, DraCluster, DraSpec, running_dra
from tests.realk8s.images import WORKLOAD_IMAGE
from tests.realk8s.inside import GiB, View

pytestmark = pytest.mark.realk8s

LAYOUT = tuple(mig_node("dra-mig"))  # GPU 1 as 3g.40gb + 2g.20gb + 1g.10gb beside two whole A100s
SMALL = LAYOUT[1].mig_devices[2]
PROFILE_1G = (f'"migProfile" in device.attributes["{contract.DRA_DRIVER}"] && '
              f'device.attributes["{contract.DRA_DRIVER}"].migProfile == "1g.10gb"')


@pytest.fixture(scope="module")
def mig_dra() -> Iterator[DraCluster]:
    with running_dra(DraSpec(nodes=1, gpu_mib=80 * 1024, node_layouts=(LAYOUT,))) as cluster:
        yield cluster


def test_a_pod_whose_claim_selects_a_profile_runs_in_that_mig_device_and_sees_its_slice(mig_dra: DraCluster) -> None:
    c = mig_dra
    ns = c.namespace()
    try:
        c.create_resource("resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "small"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": SHARE_CLASS, "capacity": {"requests": {"memory": "2Gi", "cores": "30"}},
                "selectors": [{"cel": {"expression": PROFILE_1G}}]}}]}}}}, ns)
        c.core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
            "nodeSelector": {MODE_LABEL: MODE_DRA},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "small"}],
            "containers": [{"name": "c0", "image": WORKLOAD_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}]}})

        def running() -> k8s.V1Pod | None:
            p = c.core.read_namespaced_pod("p", ns)
            assert p.status.phase != "Failed", (p.status.reason, p.status.message)
            return p if p.status.phase == "Running" else None

        c.wait(running, "pod p Running", timeout=120)
        view = View(c.probe(ns, "p", "c0"))
        assert view.limits.get("device.0.uuid") == SMALL.uuid, view.limits
        assert int(view.limits["device.0.memory_limit"]) == 2 * GiB
        assert view.runtime_total == 2 * GiB, view.raw["runtime"]
    except AssertionError:
        print(c.logs())
        raise
    finally:
        c.clear_namespace(ns)
