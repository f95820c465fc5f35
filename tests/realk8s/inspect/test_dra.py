"""`devplugin inspect` against the real kube-apiserver (1.36, e2e/bin) in a DRA cluster: the test writes the
ResourceSlices `devplugin dra` publishes (devplugin/dra/slices.py: node-a with two 16 GiB GPUs) and claims with
their allocation through the status subresource, as kube-scheduler would (shares with consumedCapacity and a
shareID, a whole GPU, a claim reserved for two pods, one claim still waiting), then runs the command as a user
does, text and JSON, whole cluster and one node, and checks the figures."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from devplugin.dra.slices import build_slices
from devplugin.gpu.device import GPU
from devplugin.gpu.facts import GpuFacts
from devplugin.inspect.cli import main
from tests.realk8s.apiserver import BareApiserver, bare_apiserver

pytestmark = pytest.mark.realk8s
GiB = 1 << 30
NS = "ml"
DRIVER = "gpu.gpushare.io"


def _gpus(node: str, count: int) -> list[GPU]:
    return [GPU(index=i, uuid=f"GPU-{node}-{i}", name="NVIDIA A100-SXM4-80GB", memory_bytes=16 * GiB, minor=i,
                pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=0) for i in range(count)]


def _claim(name: str, cls: str, caps: dict[str, str] | None = None) -> dict:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if caps:
        exactly["capacity"] = {"requests": caps}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[BareApiserver, dict[str, str]]]:
    """The apiserver with node-a's slices and four claims; yields it and the shareIDs written, by claim."""
    root = Path(tempfile.mkdtemp(prefix="gs-idra-", dir="/tmp"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        api = cleanup.enter_context(bare_apiserver(root, "admintoken", timeout=90))
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(str(api.kubeconfig), client_configuration=cfg)
        api_client = cleanup.enter_context(k8s.ApiClient(cfg))
        core, resource = k8s.CoreV1Api(api_client), k8s.ResourceV1Api(api_client)
        core.create_node({"metadata": {"name": "node-a"}})
        core.create_namespace({"metadata": {"name": NS}})
        for s in build_slices("node-a", _gpus("node-a", 2), GpuFacts({}, "550.54.15"), {}, 1):
            resource.create_resource_slice(s)
        share_ids: dict[str, str] = {}

        def allocate(name: str, device: str, pods: list[str], consumed: dict[str, str] | None) -> None:
            claim = json.loads(resource.read_namespaced_resource_claim(name, NS, _preload_content=False).data)
            result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device}
            if consumed is not None:
                share_ids[name] = result["shareID"] = str(uuid.uuid4())
                result["consumedCapacity"] = consumed
            claim["status"] = {
                "allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
                "reservedFor": [{"resource": "pods", "name": p, "uid": str(uuid.uuid4())} for p in pods]}
            resource.replace_namespaced_resource_claim_status(name, NS, claim)

        for name, cls, caps in (("train", DRIVER, {"memory": "6Gi", "cores": "50"}),
                                ("serve", DRIVER, {"memory": "2Gi", "cores": "20"}),
                                ("whole", "whole." + DRIVER, None),
                                ("waiting", DRIVER, {"memory": "12Gi", "cores": "40"})):
            resource.create_namespaced_resource_claim(NS, _claim(name, cls, caps))
        allocate("train", "gpu-0", ["train-0"], {"memory": "6Gi", "cores": "50"})
        allocate("serve", "gpu-0", ["serve-a", "serve-b"], {"memory": "2Gi", "cores": "20"})
        allocate("whole", "gpu-1-whole", ["big-0"], None)
        yield api, share_ids


def run(capsys: pytest.CaptureFixture[str], api: BareApiserver, *args: str) -> str:
    assert main(["--kubeconfig", str(api.kubeconfig), "--no-use", *args]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "inspect:" not in err, err  # nothing left out (urllib3 may warn of the test's unverified TLS)
    return out


def test_json_has_each_claim_on_its_gpu_and_the_gpus_figures(cluster: tuple[BareApiserver, dict[str, str]],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    api, share_ids = cluster
    dra = json.loads(run(capsys, api, "-o", "json"))["dra"]
    (node,) = dra["nodes"]
    gpu0, gpu1 = node["gpus"]
    assert [(c["name"], c["pods"], c["memory"], c["cores"], c["shareID"]) for c in gpu0["claims"]] == [
        ("serve", ["serve-a", "serve-b"], 2 * GiB, 20, share_ids["serve"]),
        ("train", ["train-0"], 6 * GiB, 50, share_ids["train"])]
    assert {k: gpu0[k] for k in ("index", "memTotal", "memAllocated", "memFree", "coreTotal", "coreAllocated",
                                 "coreFree", "whole")} == {
        "index": 0, "memTotal": 16 * GiB, "memAllocated": 8 * GiB, "memFree": 8 * GiB, "coreTotal": 100,
        "coreAllocated": 70, "coreFree": 30, "whole": False}
    assert [(c["name"], c["pods"], c["whole"], c["shareID"]) for c in gpu1["claims"]] == [
        ("whole", ["big-0"], True, "")]
    assert (gpu1["memAllocated"], gpu1["memFree"], gpu1["coreFree"], gpu1["whole"]) == (16 * GiB, 0, 0, True)
    assert [(p["name"], p["requests"]) for p in dra["pending"]] == [
        ("waiting", ["gpu: cores 40, memory 12Gi (gpu.gpushare.io)"])]
    assert (dra["memTotal"], dra["memAllocated"], dra["largestGpuMemory"]) == (32 * GiB, 24 * GiB, 16 * GiB)


def test_text_shows_the_gpus_and_with_details_the_claims(cluster: tuple[BareApiserver, dict[str, str]],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    api, share_ids = cluster
    text = run(capsys, api, "-d")
    assert text.startswith("DRA (gpu.gpushare.io)\nnode-a\n")  # a DRA-only cluster: no device-plugin block
    assert "  0    8/16         8     70/100   30    2\n" in text
    assert f"       ml/train (gpu)  train-0  6 GiB  50 %  share {share_ids['train'][:8]}\n" in text
    assert "       ml/serve (gpu)  serve-a,serve-b  2 GiB  20 %" in text
    assert "  1    16/16        0     whole    0     1\n       ml/whole (gpu)  big-0  whole GPU\n" in text
    assert "\nml/waiting     gpu: cores 40, memory 12Gi (gpu.gpushare.io)\n" in text  # under PENDING CLAIM
    assert text.endswith("Allocated/Total GPU Memory (DRA): 24/32 GiB (75%)\n")
    one = run(capsys, api, "node-a")
    assert "node-a" in one and "waiting" not in one and "Largest GPU" not in one
