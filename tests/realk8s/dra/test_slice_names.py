"""A node's DRA plugin owns its ResourceSlices' names, and a node whose names are taken still publishes: on the real
kube-apiserver (1.36, e2e/bin) with deploy/components/dra-node's RBAC and slice policy, each plugin running
`devplugin dra`'s publisher with a token bound to its DaemonSet pod, as the DaemonSet mounts it.

Node A's plugin cannot create slices under node B's names (`node-b-gpushare-devices`), nor of another pool or
driver; slices already holding B's names (written by A before the policy, or by anyone else) do not keep B from
publishing: B's plugin publishes under other names of its own, finds them again on the next pass and after a
restart, and removes only its own."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devplugin import contract
from devplugin.dra.publisher import SlicePublisher
from devplugin.dra.slices import build_slices
from devplugin.gpu.facts import GpuFacts
from devplugin.kube.client import load_api_client
from tests.dra.objects import GPUS
from tests.realk8s import kubeconfigs
from tests.realk8s.apiserver import bare_apiserver
from tests.support.deploy_render import DEPLOY, REPO

pytestmark = pytest.mark.realk8s
COMPONENT = DEPLOY / "components" / "dra-node"
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
PLUGIN_SA = "gpushare-dra-plugin"
NODES = ("node-a", "node-b")


@dataclass
class Cluster:
    admin: client.ResourceV1Api
    plugin: dict[str, client.ApiClient]  # node -> its plugin's client (token bound to the plugin's pod there)

    def publisher(self, node: str) -> SlicePublisher:
        return SlicePublisher(self.plugin[node], node,
                              lambda gen: build_slices(node, GPUS, GpuFacts({}, ""), {}, gen))

    def slices(self, node: str = "") -> dict[str, dict]:
        """Name -> slice, of `node` (all nodes when "")."""
        selector = f"spec.nodeName={node}" if node else ""
        resp = self.admin.list_resource_slice(field_selector=selector, _preload_content=False)
        return {s["metadata"]["name"]: s for s in json.loads(resp.data)["items"]}


def kubectl(kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def slice_body(name: str, node: str, pool: str = "", driver: str = contract.DRA_DRIVER) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool or node, "generation": 1,
                                                                   "resourceSliceCount": 1}, "devices": []}}


def create(api: client.ApiClient, body: dict) -> tuple[int, str]:
    """(HTTP status, the policy's message or "") of creating a ResourceSlice."""
    try:
        client.ResourceV1Api(api).create_resource_slice(body)
    except ApiException as exc:
        return exc.status, str(json.loads(exc.body).get("message", "")).split("denied request: ")[-1]
    return 201, ""


def wait_for(check: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gs-dra-names-", dir="/tmp"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        api = cleanup.enter_context(bare_apiserver(root, "admintoken", timeout=90))
        kubectl(api.kubeconfig, "apply", "-f", str(COMPONENT / "rbac.yaml"), "-f", str(COMPONENT / "slice-policy.yaml"))
        admin = load_api_client(str(api.kubeconfig))
        core = client.CoreV1Api(admin)
        plugin = {}
        for node in NODES:
            core.create_node({"metadata": {"name": node}})
            # the DaemonSet's pod on the node, as its controller would create it; the token bound to it names the node
            pod = core.create_namespaced_pod("kube-system", {
                "metadata": {"name": f"{PLUGIN_SA}-{node}"},
                "spec": {"serviceAccountName": PLUGIN_SA, "automountServiceAccountToken": False, "nodeName": node,
                         "containers": [{"name": "dra-plugin", "image": "gpushare/devplugin:0.1.0"}]}})
            token = kubeconfigs.service_account_token(api.kubeconfig, "kube-system", PLUGIN_SA,
                                                      (pod.metadata.name, pod.metadata.uid))
            path = kubeconfigs.write(root / f"plugin-{node}.kubeconfig", api.server, None, PLUGIN_SA, token=token)
            plugin[node] = load_api_client(str(path))
        c = Cluster(client.ResourceV1Api(admin), plugin)

        def refused() -> bool:  # the policy takes effect once the apiserver has compiled it
            code, msg = create(plugin["node-a"], slice_body("probe", "node-b"))
            assert code in (201, 403, 422), msg
            if code == 201:
                c.admin.delete_resource_slice("probe")
            return code != 201

        wait_for(refused, "the slice policy never took effect")
        yield c


@pytest.mark.parametrize("name", ["node-b-gpushare-devices", "node-b-gpushare-counters",
                                  "node-b-gpushare-devices-0123abcd", "node-a-gpushare-devices-mine",
                                  "node-a-gpushare-gpus", "anything"])
def test_a_plugin_creates_no_slice_under_a_name_its_node_does_not_own(cluster: Cluster, name: str) -> None:
    code, msg = create(cluster.plugin["node-a"], slice_body(name, "node-a"))
    if code == 201:
        cluster.admin.delete_collection_resource_slice(field_selector="spec.nodeName=node-a")
    assert (code, msg) == (403, (
        "the gpushare DRA plugin of node node-a may write only ResourceSlices named node-a-gpushare-counters or "
        f"node-a-gpushare-devices, or either followed by -<8 hex digits>, not {name}"))


def test_a_plugin_creates_slices_under_its_own_names_only_of_its_pool_and_driver(cluster: Cluster) -> None:
    a = cluster.plugin["node-a"]
    for name in ("node-a-gpushare-counters", "node-a-gpushare-devices", "node-a-gpushare-devices-0123abcd"):
        assert create(a, slice_body(name, "node-a")) == (201, "")
    assert create(a, slice_body("node-a-gpushare-counters-89abcdef", "node-a", pool="node-b")) == (403, (
        "the gpushare DRA plugin of node node-a may write only ResourceSlices of pool node-a"))
    assert create(a, slice_body("node-a-gpushare-counters-89abcdef", "node-a", driver="gpu.example.com")) == (403, (
        "the gpushare DRA plugin of node node-a may write only ResourceSlices of driver gpu.gpushare.io, not "
        "gpu.example.com"))
    cluster.admin.delete_collection_resource_slice(field_selector="spec.nodeName=node-a")


def test_a_node_whose_slice_names_are_taken_still_publishes(cluster: Cluster) -> None:
    # what node-a's plugin could write before the policy (or anyone with create on ResourceSlices may write)
    squatted = {name: slice_body(name, "node-a") for name in ("node-b-gpushare-counters", "node-b-gpushare-devices")}
    for body in squatted.values():
        cluster.admin.create_resource_slice(body)
    try:
        pub = cluster.publisher("node-b")
        assert pub.sync(), pub.last_error
        mine = cluster.slices("node-b")
        assert sorted(re.sub(r"-[0-9a-f]{8}$", "-<hex>", n) for n in mine) == [
            "node-b-gpushare-counters-<hex>", "node-b-gpushare-devices-<hex>"]
        wanted = build_slices("node-b", GPUS, GpuFacts({}, ""), {}, pub.generation)
        for obj in mine.values():
            role = obj["metadata"]["name"].rsplit("-", 1)[0]
            expect = next(w for w in wanted if w["metadata"]["name"] == role)
            assert obj["spec"]["pool"] == expect["spec"]["pool"] == {  # type: ignore[index]
                "name": "node-b", "generation": pub.generation, "resourceSliceCount": 2}
            assert obj["spec"].get("devices", []) == expect["spec"].get("devices", [])  # type: ignore[union-attr]
        # the next pass finds them by node and driver: nothing to write
        generation = pub.generation
        assert pub.sync() and pub.generation == generation and cluster.slices("node-b").keys() == mine.keys()
        # a restarted plugin finds them again: rewritten in place, no slice more
        again = cluster.publisher("node-b")
        assert again.sync(), again.last_error
        assert cluster.slices("node-b").keys() == mine.keys() and again.generation == generation + 1
        # leaving DRA mode removes its own slices only
        assert again.delete() == 2
        assert cluster.slices("node-b") == {} and cluster.slices("node-a").keys() == squatted.keys()
    finally:
        cluster.admin.delete_collection_resource_slice()


def test_a_node_gets_its_first_names_back_once_they_are_free(cluster: Cluster) -> None:
    cluster.admin.create_resource_slice(slice_body("node-b-gpushare-devices", "node-a"))
    try:
        pub = cluster.publisher("node-b")
        assert pub.sync(), pub.last_error
        names = sorted(cluster.slices("node-b"))
        assert names[0] == "node-b-gpushare-counters" and re.fullmatch(r"node-b-gpushare-devices-[0-9a-f]{8}",
                                                                        names[1]), names
        # an administrator removes the squatter and this node's slices: the next pass takes the first names
        cluster.admin.delete_collection_resource_slice()
        assert pub.sync(), pub.last_error
        assert sorted(cluster.slices("node-b")) == ["node-b-gpushare-counters", "node-b-gpushare-devices"]
    finally:
        cluster.admin.delete_collection_resource_slice()
