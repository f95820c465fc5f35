"""NodePrepareResources checks the pods its claims are reserved for (one container, one request of this driver)
from the pods the plugin's watch shows on its node, without a GET per pod; a pod the watch has not shown yet, or
shows with another UID, is read from the apiserver as before."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import kubernetes

from devplugin.dra.claims import ClaimRef
from devplugin.dra.conflicts import ConflictCheck
from devplugin.dra.pods import PodsOnNode
from devplugin.dra.prepare import Preparer
from devplugin.dra.slices import devices_by_name
from devplugin.isolation.shim_files import ShimPaths
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.dra.objects import GPUS, NODE, claim, result

UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"
POD_UID = "33333333-3333-4333-8333-333333333333"


def two_claims_one_container(pod_uid: str = POD_UID) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": "p", "uid": pod_uid}, "spec": {
        "resourceClaims": [{"name": "x", "resourceClaimName": "a"}, {"name": "y", "resourceClaimTemplateName": "t"}],
        "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "x"}, {"name": "y"}]}}]},
        "status": {"resourceClaimStatuses": [{"name": "y", "resourceClaimName": "b"}]}}


class Apiserver:
    """Claims and pods as the apiserver answers them; counts the pod GETs."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Any] = {}
        self.pods: dict[tuple[str, str], Any] = {}
        self.pod_reads = 0

    def read_claim(self, ns: str, name: str) -> object:
        return self.claims[(ns, name)]

    def read_pod(self, ns: str, name: str) -> object:
        self.pod_reads += 1
        return self.pods[(ns, name)]

    def add(self, obj: dict[str, Any], pod_uid: str = POD_UID) -> ClaimRef:
        meta = obj["metadata"]
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod_uid}]
        self.claims[(meta["namespace"], meta["name"])] = obj
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def preparer(tmp_path: Path, api: Apiserver, cached: Any) -> Preparer:
    return Preparer(NODE, devices_by_name(GPUS), api.read_claim, tmp_path / "cdi", tmp_path / "plugin" /
                    "checkpoint.json", shim=ShimPaths(tmp_path / "shim", tmp_path / "libgpushare.so"),
                    conflicts=ConflictCheck(api.read_pod, cached))


def test_the_pods_a_claim_is_reserved_for_come_from_the_watch(tmp_path: Path) -> None:
    api = Apiserver()
    a = api.add(claim(UID1, [result("gpu-0", "1Gi", "10")], name="a"))
    b = api.add(claim(UID2, [result("gpu-1", "1Gi", "10")], name="b"))
    watched = {("team-a", "p"): two_claims_one_container()}
    out = preparer(tmp_path, api, lambda ns, name, uid: (
        p if (p := watched.get((ns, name))) and p["metadata"]["uid"] == uid else None)).prepare([a, b])
    for u in (UID1, UID2):
        assert "container main of pod team-a/p would get 2 requests of gpu.gpushare.io (a/gpu, b/gpu)" in out[u].error
    assert api.pod_reads == 0, "the pod was read from the watch, not the apiserver"


def test_a_pod_the_watch_does_not_hold_as_reserved_is_read_from_the_apiserver(tmp_path: Path) -> None:
    api = Apiserver()
    api.pods[("team-a", "p")] = two_claims_one_container()
    a = api.add(claim(UID1, [result("gpu-0", "1Gi", "10")], name="a"))
    b = api.add(claim(UID2, [result("gpu-1", "1Gi", "10")], name="b"))
    old = two_claims_one_container(str(uuid.uuid4()))  # the pod of that name before it was re-created
    old["spec"]["containers"] = [{"name": "one", "resources": {"claims": [{"name": "x"}]}},
                                 {"name": "two", "resources": {"claims": [{"name": "y"}]}}]
    unnamed = two_claims_one_container()  # the template's claim not yet in its status
    unnamed["status"]["resourceClaimStatuses"] = []
    for n, cached in enumerate((lambda *_: None, lambda *_: old, lambda *_: unnamed)):
        out = preparer(tmp_path / str(n), api, cached).prepare([a, b])
        assert "would get 2 requests" in out[UID1].error and "would get 2 requests" in out[UID2].error
        assert api.pod_reads == n + 1


def wait_for(check: Any, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_the_watch_holds_the_pods_bound_to_this_node_with_their_claims() -> None:
    with FakeApiserver() as server:
        api_client = kubernetes.config.new_client_from_config(config_file=server.kubeconfig_path)
        pods = PodsOnNode(api_client, NODE).start()
        try:
            mine = two_claims_one_container()
            mine["spec"]["nodeName"] = NODE
            created = server.add_pod(mine)
            other = two_claims_one_container()
            other["metadata"]["name"] = "elsewhere"
            other["spec"]["nodeName"] = "other-node"
            server.add_pod(other)
            uid = created["metadata"]["uid"]
            wait_for(lambda: pods.get("team-a", "p", uid) is not None)
            got = pods.get("team-a", "p", uid)
            assert got is not None
            assert got["spec"]["containers"] == [{"name": "main", "resources": {"claims": [{"name": "x"},
                                                                                          {"name": "y"}]}}]
            assert got["status"]["resourceClaimStatuses"] == [{"name": "y", "resourceClaimName": "b"}]
            assert pods.get("team-a", "p", "another-uid") is None
            assert pods.get("team-a", "elsewhere", "") is None and len(pods) == 1
            server.delete_pod("team-a", "p")
            wait_for(lambda: pods.get("team-a", "p", uid) is None)
        finally:
            pods.stop()
