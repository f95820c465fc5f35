"""`devplugin dra-limits --write` keeps the claim policies' largest GPU memory on the real kube-apiserver (1.36,
e2e/bin): with slices of a 16 GiB node and an 80 GiB node (devplugin/dra/slices.py) and the component's policies,
a claim of 81Gi is accepted while the ConfigMap is empty, the command writes 80Gi, and from then on the 81Gi
claim is refused by the apiserver and 80Gi still accepted; without any slice it writes nothing."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from devplugin.app.cli import main
from devplugin.dra.slices import build_slices
from devplugin.gpu.device import GPU
from devplugin.gpu.facts import GpuFacts
from tests.realk8s.apiserver import BareApiserver, bare_apiserver

pytestmark = pytest.mark.realk8s
REPO = Path(__file__).resolve().parents[3]
GiB = 1 << 30


def _claim(name: str, memory: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.gpushare.io", "capacity": {"requests": {"memory": memory, "cores": "50"}}}}]}}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[BareApiserver, k8s.ApiClient]]:
    root = Path(tempfile.mkdtemp(prefix="gs-dlim-", dir="/tmp"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        api = cleanup.enter_context(bare_apiserver(root, "admintoken", timeout=90))
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(str(api.kubeconfig), client_configuration=cfg)
        api_client = cleanup.enter_context(k8s.ApiClient(cfg))
        subprocess.run([str(REPO / ".venv" / "bin" / "kubectl"), "--kubeconfig", str(api.kubeconfig), "apply",
                        "-f", str(REPO / "deploy/components/dra/claim-policies.yaml")],
                       check=True, capture_output=True, timeout=60)
        yield api, api_client


def _create(resource: k8s.ResourceV1Api, claim: dict) -> int:
    try:
        resource.create_namespaced_resource_claim("default", claim)
    except ApiException as exc:
        return int(exc.status)
    return 201


def test_write_sets_the_figure_the_policy_then_enforces(cluster: tuple[BareApiserver, k8s.ApiClient],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = cluster
    resource = k8s.ResourceV1Api(api_client)
    kubeconfig = ["--kubeconfig", str(api.kubeconfig)]
    # no slice yet: nothing to write
    assert main(["dra-limits", "--write", *kubeconfig]) == 1
    assert "no ResourceSlice of gpu.gpushare.io publishes a GPU: nothing written" in capsys.readouterr().err
    for node, size in (("small", 16), ("big", 80)):
        gpus = [GPU(index=0, uuid=f"GPU-{node}", name="NVIDIA", memory_bytes=size * GiB, minor=0,
                    pci_bus_id="00000000:10:00.0", numa_node=0)]
        for s in build_slices(node, gpus, GpuFacts({}, ""), {}, 1):
            resource.create_resource_slice(s)
    assert _create(resource, _claim("before", "81Gi")) == 201  # shipped empty: not checked
    assert main(["dra-limits", *kubeconfig]) == 0
    assert capsys.readouterr().out == (
        "largest GPU memory the ResourceSlices publish: 80Gi\n"
        "ConfigMap kube-system/gpushare-dra-limits largestGpuMemory: empty (claims' memory is not checked against "
        "a maximum)\n")
    assert main(["dra-limits", "--write", *kubeconfig]) == 0
    assert capsys.readouterr().out.endswith("ConfigMap kube-system/gpushare-dra-limits largestGpuMemory set to 80Gi\n")
    cm = k8s.CoreV1Api(api_client).read_namespaced_config_map("gpushare-dra-limits", "kube-system")
    assert cm.data == {"largestGpuMemory": "80Gi"}
    deadline = time.monotonic() + 30  # the apiserver reads the parameter through an informer
    n = 0
    while _create(resource, _claim(f"after-{n}", "81Gi")) != 422:
        assert time.monotonic() < deadline, "the written limit never took effect"
        n += 1
        time.sleep(0.3)
    assert _create(resource, _claim("largest", "80Gi")) == 201
    assert main(["dra-limits", *kubeconfig]) == 0
    assert "largestGpuMemory: 80Gi (current)" in capsys.readouterr().out
    # the ConfigMap deleted: --write makes it again
    k8s.CoreV1Api(api_client).delete_namespaced_config_map("gpushare-dra-limits", "kube-system")
    assert main(["dra-limits", "--write", *kubeconfig]) == 0
    assert "largestGpuMemory: no such ConfigMap" in capsys.readouterr().out
    cm = k8s.CoreV1Api(api_client).read_namespaced_config_map("gpushare-dra-limits", "kube-system")
    assert cm.data == {"largestGpuMemory": "80Gi"}
