"""Services as pods meet them on the test cluster: a ClusterIP Service's name resolves (the pods' hosts files) to
its address, where the Service proxy forwards to a ready endpoint (its port mapped to the target port); a headless
Service's name resolves to its pods; `kubernetes.default.svc` is the apiserver, which a pod's service-account token
authenticates to."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.realk8s.cluster import Cluster
from tests.realk8s.images import PLAIN_IMAGE

pytestmark = pytest.mark.realk8s

FETCH = """import json, ssl, sys, urllib.request
url = sys.argv[1]
headers = {}
ctx = None
if url.startswith("https://"):
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
    headers["Authorization"] = "Bearer " + open(sa + "/token").read()
try:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5, context=ctx) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__ + ": " + str(e)}))
"""


def server_pod(name: str, labels: dict[str, str], text: str, **spec: Any) -> dict[str, Any]:
    script = f"mkdir -p /tmp/w && cd /tmp/w && echo {text} > ping && python -m http.server 8080"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 2, **spec,
                     "containers": [{"name": "srv", "image": PLAIN_IMAGE, "command": ["sh", "-c", script],
                                     "ports": [{"name": "http", "containerPort": 8080}]}]}}


def client_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "cli", "image": PLAIN_IMAGE, "command": ["sleep", "3600"]}]}}


def running(cluster: Cluster, ns: str, names: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(cluster.core.read_namespaced_pod(n, ns).status.phase == "Running" for n in names):
        assert time.monotonic() < deadline, f"{names} not Running within {timeout} s"
        time.sleep(0.2)


def fetch(cluster: Cluster, ns: str, url: str, want: Any, timeout: float = 30) -> dict[str, Any]:
    """GET url from the client pod until `want(answer)` (endpoints and hosts files follow the pods a moment
    later); the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.exec(ns, "client", "cli", ["python", "-c", FETCH, url])
        answer: dict[str, Any] = json.loads(out["stdout"] or "{}") if out["exitCode"] == 0 else {"exec": out}
        if want(answer) or time.monotonic() > deadline:
            return answer
        time.sleep(0.3)


def test_a_cluster_ip_service_reaches_its_ready_pods_through_its_port(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, server_pod("web-0", {"app": "web"}, "pong"))
    realk8s.core.create_namespaced_pod(ns, client_pod("client"))
    realk8s.core.create_namespaced_service(ns, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}})
    running(realk8s, ns, ["web-0", "client"])
    for url in (f"http://web.{ns}.svc.cluster.local/ping", "http://web/ping", f"http://web.{ns}/ping"):
        answer = fetch(realk8s, ns, url, lambda a: a.get("status") == 200)
        assert answer == {"status": 200, "body": "pong\n"}, (url, answer)


def test_a_headless_service_resolves_to_its_pods(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_service(ns, {"metadata": {"name": "head"}, "spec": {
        "clusterIP": "None", "selector": {"app": "head"}, "ports": [{"port": 8080}]}})
    realk8s.core.create_namespaced_pod(ns, server_pod("head-0", {"app": "head"}, "from-head",
                                                      hostname="head-0", subdomain="head"))
    realk8s.core.create_namespaced_pod(ns, client_pod("client"))
    running(realk8s, ns, ["head-0", "client"])
    answer = fetch(realk8s, ns, f"http://head.{ns}.svc.cluster.local:8080/ping", lambda a: a.get("status") == 200)
    assert answer == {"status": 200, "body": "from-head\n"}, answer
    answer = fetch(realk8s, ns, f"http://head-0.head.{ns}.svc.cluster.local:8080/ping",
                   lambda a: a.get("status") == 200)
    assert answer == {"status": 200, "body": "from-head\n"}, answer


def test_kubernetes_default_svc_is_the_apiserver_and_the_pods_token_authenticates(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, client_pod("client"))
    running(realk8s, ns, ["client"])
    env = realk8s.exec(ns, "client", "cli", ["sh", "-c", "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"])
    assert env["stdout"] == "10.0.0.1:443\n"
    answer = fetch(realk8s, ns, f"https://kubernetes.default.svc/api/v1/namespaces/{ns}/pods/client",
                   lambda a: "status" in a)
    # authenticated as the pod's service account (which has no rights here): the apiserver says who it is
    assert answer["status"] == 403, answer
    assert f"system:serviceaccount:{ns}:default" in answer["body"], answer


def test_pods_reach_each_other_on_the_pod_network_and_nothing_else(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, server_pod("server", {"app": "direct"}, "pong"))
    realk8s.core.create_namespaced_pod(ns, client_pod("client"))
    running(realk8s, ns, ["server", "client"])
    ip = realk8s.core.read_namespaced_pod("server", ns).status.pod_ip
    answer = fetch(realk8s, ns, f"http://{ip}:8080/ping", lambda a: a.get("status") == 200)
    assert answer == {"status": 200, "body": "pong\n"}, answer
    # the node's loopback (where the apiserver listens) is not the pod's, and no route leaves the bridge
    port = int(realk8s.server.rsplit(":", 1)[1])
    probe = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)\n"
             "    print('open')\nexcept OSError as e:\n    print(type(e).__name__)")
    for host, p in (("127.0.0.1", port), ("1.1.1.1", 443), ("10.88.0.1", port)):
        out = realk8s.exec(ns, "client", "cli", ["python", "-c", probe, host, str(p)])
        assert out["exitCode"] == 0 and out["stdout"] != "open\n", (host, p, out)
