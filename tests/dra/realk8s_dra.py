"""A bare kube-apiserver (tests/realk8s/apiserver.py) plus the real kube-scheduler, and the objects the DRA tests
create there: a Node, the DeviceClasses, claims and pods that use them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from devplugin import contract
from tests.realk8s.apiserver import BareApiserver, bare_apiserver
from tests.realk8s.binaries import binary
from tests.realk8s.processes import Proc, free_port

TOKEN = "dra-admin-token"
SHARE_CLASS = contract.DRA_DRIVER
WHOLE_CLASS = "whole." + contract.DRA_DRIVER


@dataclass
class DraCluster:
    api: BareApiserver
    client: k8s.ApiClient
    scheduler: Proc

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.client)

    @property
    def resource(self) -> Any:
        return k8s.ResourceV1Api(self.client)

    def claim(self, ns: str, name: str) -> dict:
        return json.loads(self.resource.read_namespaced_resource_claim(name, ns, _preload_content=False).data)

    def pod(self, ns: str, name: str) -> dict:
        return json.loads(self.core.read_namespaced_pod(name, ns, _preload_content=False).data)


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def device_classes() -> list[dict]:
    def cls(name: str, kind: str) -> dict:
        expr = (f'device.driver == "{contract.DRA_DRIVER}" && '
                f'device.attributes["{contract.DRA_DRIVER}"].{contract.DRA_ATTR_TYPE} == "{kind}"')
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expr}}]}}
    return [cls(SHARE_CLASS, contract.DRA_TYPE_SHARE), cls(WHOLE_CLASS, contract.DRA_TYPE_WHOLE)]


def node_object(name: str, labels: dict[str, str] | None = None) -> dict:
    labels = {"kubernetes.io/hostname": name, **(labels or {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "ok", "lastHeartbeatTime": None, "lastTransitionTime": None}]}}


def add_node(dc: DraCluster, name: str, labels: dict[str, str] | None = None) -> None:
    core = dc.core
    core.create_node(node_object(name, labels))
    core.patch_node_status(name, {"status": node_object(name)["status"]})
    # No node lifecycle controller here: drop the not-ready taint that TaintNodesByCondition put on the new Node.
    core.patch_node(name, {"spec": {"taints": None}})


def share_claim(ns: str, name: str, memory: str | None = None, cores: str | None = None,
                cls: str = SHARE_CLASS, count: int = 1) -> dict:
    req: dict[str, Any] = {"deviceClassName": cls, "count": count}
    caps = {k: v for k, v in ((contract.DRA_CAPACITY_MEMORY, memory), (contract.DRA_CAPACITY_CORES, cores)) if v}
    if caps:
        req["capacity"] = {"requests": caps}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": req}]}}}


def pod_with_claims(ns: str, name: str, claims: list[str], node: str = "") -> dict:
    """A pod whose one container uses every claim; kept to `node` (by its hostname label) when given."""
    refs = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    pin = {"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {**pin, "resourceClaims": refs, "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": r["name"]} for r in refs]}}]}}


def deallocate(dc: DraCluster, ns: str, name: str) -> None:
    """What the resourceclaim controller does once the claim's pods are gone: clear reservedFor and allocation."""
    claim = dc.claim(ns, name)
    claim["status"] = {}
    dc.resource.replace_namespaced_resource_claim_status(name, ns, claim)


@contextmanager
def dra_cluster(root: Path) -> Iterator[DraCluster]:
    """The bare apiserver with the DeviceClasses, and kube-scheduler (all 1.36 feature gates as shipped)."""
    with bare_apiserver(root, TOKEN) as api:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(str(api.kubeconfig), client_configuration=cfg)
        api_client = k8s.ApiClient(cfg)
        resource = k8s.ResourceV1Api(api_client)
        # No controller-manager: the namespace's default ServiceAccount, which pod admission looks up, is ours to make.
        k8s.CoreV1Api(api_client).create_namespaced_service_account(
            "default", {"metadata": {"name": "default"}, "automountServiceAccountToken": False})
        for cls in device_classes():
            resource.create_device_class(cls)
        sched = Proc("kube-scheduler", [str(binary("kube-scheduler")), f"--kubeconfig={api.kubeconfig}",
                                        f"--authentication-kubeconfig={api.kubeconfig}",
                                        f"--authorization-kubeconfig={api.kubeconfig}",
                                        "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                                        "--leader-elect=false", "--v=2"], root / "logs" / "kube-scheduler.log")
        sched.start()
        try:
            sched.wait_for_line(r"Serving securely|Starting Kubernetes Scheduler", timeout=60)
            yield DraCluster(api, api_client, sched)
        finally:
            sched.stop()
            api_client.close()


@contextmanager
def shipped_dra_cluster(prefix: str, node: str, gpus: Callable[[], list[Any]]) -> Iterator[DraCluster]:
    """dra_cluster with the shipped DeviceClasses' selectors and claim policies (deploy/components/dra), and `node`
    publishing the ResourceSlices of `gpus()` (devplugin.gpu.device.GPU) as `devplugin dra` would."""
    import subprocess
    import tempfile

    import yaml

    from devplugin.dra.publisher import SlicePublisher
    from devplugin.dra.slices import build_slices
    from devplugin.gpu.facts import GpuFacts

    repo = Path(__file__).resolve().parents[2]
    component = repo / "deploy" / "components" / "dra"
    root = Path(tempfile.mkdtemp(prefix=prefix))
    with dra_cluster(root) as dc:
        for doc in yaml.safe_load_all((component / "deviceclasses.yaml").read_text()):
            dc.resource.patch_device_class(doc["metadata"]["name"], {"spec": doc["spec"]})  # the shipped selectors
        subprocess.run([str(repo / ".venv" / "bin" / "kubectl"), "--kubeconfig", str(dc.api.kubeconfig), "apply",
                        "-f", str(component / "claim-policies.yaml")], check=True, capture_output=True, timeout=60)
        add_node(dc, node)
        pub = SlicePublisher(dc.client, node, lambda gen: build_slices(node, gpus(), GpuFacts({}, "550.54.15"), {},
                                                                       gen))
        assert pub.sync(), pub.last_error
        yield dc
