"""The node daemon's identity changes only what the daemon writes, on the real kube-apiserver (1.36, e2e/bin) with
the shipped RBAC and admission policies (deploy/base) and a token bound to the daemon's Pod, as the DaemonSet
mounts it: the daemon's own writers (ClusterReporter through KubeWriter) record a pod's placement, publish the
Node's inventory and usage and post Events; with the same token, a Node's labels (NodeRestriction's
node-restriction.kubernetes.io/* included), taints and other annotations, and a pod's labels, images,
tolerations, finalizers and other annotations, stay as they were (policy gpushare-node-daemon-scope)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devplugin import contract as c
from devplugin.allocation.holdings import Holdings
from devplugin.allocation.requests import ContainerRequest, PodRequest
from devplugin.kube.client import load_api_client
from devplugin.kube.reporting import ClusterReporter
from devplugin.kube.writer import KubeWriter
from tests.realk8s import kubeconfigs
from tests.realk8s.apiserver import bare_apiserver
from tests.support.nodes import make_node

REPO = Path(__file__).resolve().parents[3]
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
pytestmark = pytest.mark.realk8s
ADMIN = "admintoken"
NS = "tenant-a"
NODE = "node-a"
DAEMON_SA = "gpushare-devplugin"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"  # lists of containers merge by name
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODE_LABELS = {c.LABEL_MODE: "core_mem", "kubernetes.io/hostname": NODE}
NODE_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0"}
POD_LABELS = {"app": "train"}
POD_ANNOTATIONS = {c.ANN_MULTI_GPU: "1", "team": "ml"}
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
NODE_OWN = "gpushare.io/gpus, gpushare.io/gpu-usage"
POD_OWN = ", ".join((c.ANN_ALLOCATED, c.ANN_ALIYUN_MEM_IDX, c.ANN_ALIYUN_ASSIGNED, c.ANN_ACK_ASSIGNED))


@dataclass
class Cluster:
    admin: client.CoreV1Api
    daemon: client.CoreV1Api  # node-a's daemon, with a token bound to its Pod
    daemon_client: client.ApiClient


def kubectl(kubeconfig: Path, *args: str, stdin: str = "") -> str:
    proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], input=stdin, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def refusal(api: client.CoreV1Api, kind: str, name: str, body: dict) -> tuple[int, str]:
    """(HTTP status, the policy's message or "") of a strategic merge patch of the Node `name` or the pod
    NS/`name`."""
    try:
        if kind == "Node":
            api.patch_node(name, body, _content_type=STRATEGIC)
        else:
            api.patch_namespaced_pod(name, NS, body, _content_type=STRATEGIC)
    except ApiException as exc:
        return exc.status, str(json.loads(exc.body).get("message", "")).split("denied request: ")[-1]
    return 200, ""


def node_view(api: client.CoreV1Api) -> dict:
    node = api.read_node(NODE)
    return {"labels": node.metadata.labels, "annotations": node.metadata.annotations,
            "taints": [t.to_dict() for t in node.spec.taints or []], "unschedulable": node.spec.unschedulable}


def pod_view(api: client.CoreV1Api, name: str) -> dict:
    pod = api.read_namespaced_pod(name, NS)
    ctr = pod.spec.containers[0]
    return {"labels": pod.metadata.labels, "annotations": pod.metadata.annotations, "image": ctr.image,
            "tolerations": [t.to_dict() for t in pod.spec.tolerations or []], "finalizers": pod.metadata.finalizers}


def tenant_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": POD_LABELS, "annotations": POD_ANNOTATIONS},
            "spec": {"nodeName": NODE, "tolerations": [TOLERATION],
                     "containers": [{"name": "main", "image": "pytorch/pytorch:2.4.0"}]}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gs-daemon-writes-", dir="/tmp"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        bare = cleanup.enter_context(bare_apiserver(root, ADMIN, timeout=90))
        kc = bare.kubeconfig
        kubectl(kc, "apply", "-f", str(REPO / "deploy/base/rbac.yaml"),
                "-f", str(REPO / "deploy/base/admission-policies.yaml"))
        admin = client.CoreV1Api(load_api_client(str(kc)))
        admin.create_node({"metadata": {"name": NODE, "labels": NODE_LABELS, "annotations": NODE_ANNOTATIONS},
                           "spec": {"taints": [TAINT]}})
        admin.create_namespace({"metadata": {"name": NS}})
        admin.create_namespaced_service_account(NS, {"metadata": {"name": "default"}})  # no controller-manager
        # The DaemonSet's pod on node-a, as its controller would create it; the daemon's token is bound to it, so
        # the apiserver names the node in the token's user (authentication.kubernetes.io/node-name).
        pod = admin.create_namespaced_pod("kube-system", {
            "metadata": {"name": f"{DAEMON_SA}-{NODE}"},
            "spec": {"serviceAccountName": DAEMON_SA, "automountServiceAccountToken": False, "nodeName": NODE,
                     "containers": [{"name": "devplugin", "image": "gpushare/devplugin:0.1.0"}]}})
        token = kubeconfigs.service_account_token(kc, "kube-system", DAEMON_SA, (pod.metadata.name, pod.metadata.uid))
        daemon_client = load_api_client(str(kubeconfigs.write(root / "daemon.kubeconfig", bare.server, None,
                                                               DAEMON_SA, token=token)))
        daemon = client.CoreV1Api(daemon_client)
        admin.create_namespaced_pod(NS, tenant_pod("probe"))
        admin.create_node({"metadata": {"name": "node-b"}})
        deadline = time.monotonic() + 90
        # a policy takes effect once the apiserver has compiled it: until node-a's daemon is refused node-b
        while refusal(daemon, "Node", "node-b", {"metadata": {"annotations": {c.ANN_NODE_GPUS: "{}"}}})[0] == 200:
            admin.patch_node("node-b", {"metadata": {"annotations": {c.ANN_NODE_GPUS: None}}}, _content_type=MERGE)
            assert time.monotonic() < deadline, "the node daemon's scope policy never took effect"
            time.sleep(0.5)
        yield Cluster(admin, daemon, daemon_client)


def test_the_daemons_own_writers_record_publish_and_post_events(cluster: Cluster) -> None:
    created = cluster.admin.create_namespaced_pod(NS, tenant_pod("placed"))
    node = make_node([15])
    writer = KubeWriter(cluster.daemon_client, NODE, backoff_max_s=0.5).start()
    reporter = ClusterReporter(node, NODE, writer)
    reporter.start()
    try:
        ask = PodRequest(NS, "placed", created.metadata.uid, NODE, "Pending", 0.0,
                         (ContainerRequest("main", False, 0, 0, mem=2, core=30),),
                         annotations={c.ANN_ACK_ALLOCATION: '{"0":{"0":2}}'})
        reporter.record(ask, "main", (c.GpuShare(index=0, uuid=node.gpus[0].uuid, mem=2, core=30),))
        reporter.warning(ask, "GPUChoiceUnreadable", "a warning on the pod")
        reporter.publish_inventory(lambda uuid: True)
        reporter.occupancy_changed(Holdings(node))  # the usage publisher writes gpushare.io/gpu-usage
        writer.node_event(NODE, "Normal", "GPUHealthy", "an event on the node")
        deadline = time.monotonic() + 30
        while c.ANN_NODE_USAGE not in (cluster.admin.read_node(NODE).metadata.annotations or {}):
            assert time.monotonic() < deadline, "the node's usage was never published"
            time.sleep(0.2)
        assert writer.flush(30)
    finally:
        reporter.stop()
        writer.stop()
    assert writer.errors == 0, "the apiserver refused a write of the daemon's own"
    pod = cluster.admin.read_namespaced_pod("placed", NS)
    ann = pod.metadata.annotations
    assert {k: ann[k] for k in (c.ANN_ALIYUN_ASSIGNED, c.ANN_ALIYUN_MEM_IDX, c.ANN_ACK_ASSIGNED)} == {
        c.ANN_ALIYUN_ASSIGNED: "true", c.ANN_ALIYUN_MEM_IDX: "0", c.ANN_ACK_ASSIGNED: "true"}
    assert c.parse_assignment(ann[c.ANN_ALLOCATED], c.ANN_ALLOCATED).uid == created.metadata.uid
    assert (pod.metadata.labels, pod.spec.tolerations[0].key) == (POD_LABELS, TOLERATION["key"])
    node_ann = cluster.admin.read_node(NODE).metadata.annotations
    assert c.ANN_NODE_GPUS in node_ann and node_ann["node.alpha.kubernetes.io/ttl"] == "0"
    reasons = {e.reason for ns in (NS, "default") for e in cluster.admin.list_namespaced_event(ns).items}
    assert {"GPUChoiceUnreadable", "GPUHealthy"} <= reasons


NODE_WRITES = {
    "restricted-label": ({"metadata": {"labels": {"node-restriction.kubernetes.io/gpu-tier": "a100"}}}, "labels"),
    "mode-label": ({"metadata": {"labels": {c.LABEL_MODE: "share"}}}, "labels"),
    "remove-taints": ({"spec": {"taints": None}}, "spec"),
    "cordon": ({"spec": {"unschedulable": True}}, "spec"),
    "other-annotation": ({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": None}}},
                         "annotation node.alpha.kubernetes.io/ttl"),
    "own-annotation-and-label": ({"metadata": {"annotations": {c.ANN_NODE_GPUS: "{}"}, "labels": {"x": "1"}}},
                                 "labels"),
}


@pytest.mark.parametrize("write", list(NODE_WRITES))
def test_the_daemon_cannot_change_its_nodes_labels_taints_or_other_annotations(cluster: Cluster, write: str) -> None:
    body, what = NODE_WRITES[write]
    before = node_view(cluster.admin)
    assert refusal(cluster.daemon, "Node", NODE, body) == (403, (
        f"gpushare: the node daemon of node {NODE} may change only the annotations {NODE_OWN} of its Node; this "
        f"request also changes {what} of Node {NODE}"))
    assert node_view(cluster.admin) == before


POD_WRITES = {
    "label": ({"metadata": {"labels": {"app": "mine"}}}, "labels"),
    "image": ({"spec": {"containers": [{"name": "main", "image": "evil/miner:1"}]}}, "spec"),
    "toleration": ({"spec": {"tolerations": [TOLERATION, {"key": "dedicated", "operator": "Exists"}]}}, "spec"),
    "finalizer": ({"metadata": {"finalizers": ["example.com/hold"]}}, "finalizers"),
    "tenant-annotation": ({"metadata": {"annotations": {c.ANN_MULTI_GPU: "4"}}}, f"annotation {c.ANN_MULTI_GPU}"),
    "removed-annotation": ({"metadata": {"annotations": {"team": None}}}, "annotation team"),
    "new-annotation": ({"metadata": {"annotations": {c.ANN_ALIYUN_ASSIGNED: "true", "x": "1"}}}, "annotation x"),
}


@pytest.mark.parametrize("write", list(POD_WRITES))
def test_the_daemon_cannot_change_a_pods_spec_labels_or_other_annotations(cluster: Cluster, write: str) -> None:
    body, what = POD_WRITES[write]
    before = pod_view(cluster.admin, "probe")
    assert refusal(cluster.daemon, "Pod", "probe", body) == (403, (
        f"gpushare: the node daemon of node {NODE} may change only the annotations {POD_OWN} of a pod; this "
        f"request also changes {what} of pod {NS}/probe"))
    assert pod_view(cluster.admin, "probe") == before
