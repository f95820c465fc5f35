"""The node agent with an apiserver (e2e/bin/nodeagent --kubeconfig, beside the real kube-apiserver 1.36 and the
kubelet's stub device plugin): its Node is registered with the devices' capacity (its taints left to the node
lifecycle controller, as NodeRestriction forbids a kubelet to change them),
pods bound to it become Running or Failed as the kubelet's rejectPod writes it, a deleted pod's deletion is
finished and its devices freed, and a restarted agent keeps its Running pods' devices from its checkpoint."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.realk8s.agent import NodeAgent
from tests.realk8s.apiserver import bare_apiserver
from tests.realk8s.stub import StubPlugin
from tests.support.daemon_harness import short_dir

pytestmark = [pytest.mark.realk8s,
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]  # loopback, own cert
TOKEN = "admintoken"
NODE = "agent-node"
DEV = "example.com/dev"


def wait(pred: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = pred()
        except (ApiException, urllib3.exceptions.HTTPError):  # an answer not yet wanted, or not listening yet
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.1)


@pytest.fixture
def cluster() -> Iterator[tuple[client.CoreV1Api, Path]]:
    root = short_dir()
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        bare = cleanup.enter_context(bare_apiserver(root, TOKEN))
        cfg = client.Configuration()
        cfg.host, cfg.verify_ssl, cfg.api_key = bare.server, False, {"authorization": f"Bearer {TOKEN}"}
        api = client.CoreV1Api(client.ApiClient(cfg))
        wait(lambda: api.list_namespace().items and api.read_namespace("default"), "the apiserver serves", 120)
        wait(lambda: api.create_namespaced_service_account("default", {"metadata": {"name": "default"}}),
             "the default service account (no controller-manager runs)", 30)
        yield api, root


def pod(name: str, devices: int, init: int = 0) -> dict[str, Any]:
    def ctr(n: str, count: int) -> dict[str, Any]:
        return {"name": n, "image": "busybox", "resources": {"limits": {DEV: str(count)}}}
    spec: dict[str, Any] = {"nodeName": NODE, "automountServiceAccountToken": False, "containers": [ctr("c", devices)]}
    if init:
        spec["initContainers"] = [ctr("i", init)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def phase(api: client.CoreV1Api, name: str, want: str) -> Any:
    p = api.read_namespaced_pod(name, "default")
    return p if p.status.phase == want else None


def test_node_agent_with_the_real_apiserver(cluster: tuple[client.CoreV1Api, Path]) -> None:
    api, root = cluster
    agent = NodeAgent(root / "node", NODE, kubeconfig=root / "kubeconfig", extra_args=["--status-period", "1s"])
    agent.start()
    stub = StubPlugin(agent.plugin_dir, DEV, 4).start()
    try:
        node = wait(lambda: (n := api.read_node(NODE)).status.allocatable.get(DEV) == "4" and n,
                    "the node publishes the stub's devices")
        assert node.status.capacity["cpu"] == "64" and node.status.capacity["pods"] == "110"
        ready = {c.type: c.status for c in node.status.conditions}
        assert ready["Ready"] == "True"
        time.sleep(1.5)  # a status period: the agent leaves the not-ready taint to the node lifecycle controller
        assert any(t.key == "node.kubernetes.io/not-ready" for t in api.read_node(NODE).spec.taints or [])
        api.patch_node(NODE, {"spec": {"taints": []}})  # as the node lifecycle controller does once it is Ready

        api.create_namespaced_pod("default", pod("two", 2, init=1))
        running = wait(lambda: phase(api, "two", "Running"), "pod two Running")
        conds = {c.type: c.status for c in running.status.conditions}
        assert conds["Ready"] == "True" and running.status.start_time is not None
        assert running.status.container_statuses[0].state.running is not None
        books = agent.books()
        (entry,) = [p for p in books["pods"] if p["name"] == "two"]
        held = {c["name"]: c["devices"][DEV] for c in entry["containers"]}
        assert len(held["c"]) == 2 and set(held["i"]) <= set(held["c"])  # the init container's device reused

        api.create_namespaced_pod("default", pod("three", 3))
        failed = wait(lambda: phase(api, "three", "Failed"), "pod three Failed")
        assert failed.status.reason == "UnexpectedAdmissionError"
        assert failed.status.message == ("Pod was rejected: Allocate failed due to requested number of devices "
                                         f"unavailable for {DEV}. Requested: 3, Available: 2, which is unexpected")

        api.delete_namespaced_pod("two", "default")  # graceful: the agent finishes the deletion
        wait(lambda: "two" not in {p.metadata.name for p in api.list_namespaced_pod("default").items},
             "pod two deleted")
        wait(lambda: all(p["name"] != "two" for p in agent.books()["pods"]), "pod two gone from the books")

        api.create_namespaced_pod("default", pod("kept", 2))
        wait(lambda: phase(api, "kept", "Running"), "pod kept Running")
        kept = [c["devices"][DEV] for p in agent.books()["pods"] if p["name"] == "kept" for c in p["containers"]]
        agent.stop()
        api.create_namespaced_pod("default", pod("while-down", 1))
        agent.start()  # it reads its pods from the apiserver once its control API serves
        books = agent.wait_books(lambda b: any(p["name"] == "kept" for p in b["pods"]))
        assert [c["devices"][DEV] for p in books["pods"] if p["name"] == "kept" for c in p["containers"]] == kept
        assert phase(api, "kept", "Running") is not None
        # Admitted before the stub registers again (it waits 10 s after the kubelet's socket reappears): the
        # device manager has no healthy device yet, as after a node reboot.
        down = wait(lambda: phase(api, "while-down", "Failed"), "pod while-down decided")
        assert "no healthy devices present" in down.status.message
    except BaseException:
        print(f"--- node agent log ---\n{agent.log_text()[-6000:]}")
        raise
    finally:
        stub.stop()
        agent.stop()
