"""The admission policies of deploy/base/admission-policies.yaml, evaluated by the real kube-apiserver (1.36, from
e2e/bin): a tenant cannot write the project's pod annotations, the extender's ServiceAccount can (through the
Binding it creates), and a node daemon's pod-bound token of node A can patch node A and A's pods only.

A bare apiserver (etcd and kube-apiserver; RBAC on; static tokens for the admin) is enough: the policies are the
apiserver's own CEL, nothing of the project's code runs."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realk8s.binaries import binary

REPO = Path(__file__).resolve().parents[1]
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
pytestmark = pytest.mark.realk8s
ADMIN = "admintoken"
NS = "tenant-a"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Api:
    server: str
    kubeconfig: Path

    def kubectl(self, *args: str, stdin: str = "") -> str:
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def call(self, method: str, path: str, body: dict, token: str = ADMIN, user: str = "") -> tuple[int, str]:
        """(HTTP status, the Status message or "") of one request with `token` (impersonating `user`)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        data = json.dumps(body).encode() if method != "GET" else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content})
        if user:
            req.add_header("Impersonate-User", user)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                return resp.status, ""
        except urllib.error.HTTPError as err:
            text = err.read()
            return err.code, json.loads(text).get("message", "") if text.startswith(b"{") else text.decode()
        except urllib.error.URLError as err:  # not listening yet
            return 0, str(err.reason)

    def token(self, account: str, node: str = "") -> str:
        bound = ["--bound-object-kind", "Node", "--bound-object-name", node] if node else []
        return self.kubectl("-n", "kube-system", "create", "token", account, *bound).strip()


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    root = Path(tempfile.mkdtemp(prefix="gs-vap-", dir="/tmp"))
    subprocess.run(["openssl", "genrsa", "-out", str(root / "sa.key"), "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(root / "sa.key"), "-pubout", "-out", str(root / "sa.pub")],
                   check=True, capture_output=True)
    (root / "tokens.csv").write_text(f"{ADMIN},admin,1,system:masters\n")
    etcd_url, api_port = f"http://127.0.0.1:{_port()}", _port()
    procs = [subprocess.Popen([str(binary("etcd")), "--data-dir", str(root / "etcd"), "--listen-client-url",
                               etcd_url, "--listen-peer-url", f"http://127.0.0.1:{_port()}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    log = (root / "apiserver.log").open("w")
    procs.append(subprocess.Popen([
        str(binary("kube-apiserver")), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
        f"--secure-port={api_port}", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
        f"--cert-dir={root / 'certs'}", f"--token-auth-file={root / 'tokens.csv'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={root / 'sa.pub'}", f"--service-account-signing-key-file={root / 'sa.key'}",
        "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=RBAC", "--profiling=false"],
        stdout=log, stderr=log))
    server = f"https://127.0.0.1:{api_port}"
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "admin", "user": {"token": ADMIN}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "admin"}}]}))
    a = Api(server, kubeconfig)
    try:
        deadline = time.monotonic() + 90
        while a.call("GET", "/readyz", {})[0] != 200:
            assert time.monotonic() < deadline, (root / "apiserver.log").read_text()[-3000:]
            assert procs[1].poll() is None, (root / "apiserver.log").read_text()[-3000:]
            time.sleep(0.5)
        a.kubectl("apply", "-f", str(REPO / "deploy/base/rbac.yaml"), "-f", str(REPO / "deploy/scheduler/rbac.yaml"),
                  "-f", str(REPO / "deploy/base/admission-policies.yaml"))
        for node in ("node-a", "node-b"):
            a.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                            "metadata": {"name": node}}))
        a.kubectl("create", "namespace", NS)
        a.kubectl("-n", NS, "create", "serviceaccount", "default")  # no controller-manager runs
        a.kubectl("-n", NS, "create", "role", "tenant", "--verb=create,get,patch,update", "--resource=pods")
        a.kubectl("-n", NS, "create", "rolebinding", "tenant", "--role=tenant", "--user=tenant")
        for node in ("a", "b"):
            assert a.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod(f"on-{node}", f"node-{node}"),
                          user="tenant")[0] == 201
        # a policy takes effect once the apiserver has compiled it: wait until a forged pod is refused
        while a.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod("probe", annotations={ALLOCATED: "{}"}),
                     user="tenant")[0] == 201:
            a.kubectl("-n", NS, "delete", "pod", "probe", "--wait=false")
            assert time.monotonic() < deadline, "the admission policies never took effect"
            time.sleep(0.5)
        yield a
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=30)
        log.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)


ALLOCATED = "gpushare.io/allocated"


def _pod(name: str, node: str = "", annotations: dict[str, str] | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": spec}


def _annotate(key: str, value: str | None) -> dict:
    return {"metadata": {"annotations": {key: value}}}


def test_a_tenant_cannot_create_a_pod_with_the_projects_annotations(api: Api) -> None:
    for key in (ALLOCATED, "gpushare.io/scheduled", "scheduler.framework.gpushare.allocation",
                "ALIYUN_COM_GPU_MEM_IDX"):
        code, msg = api.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod("forger", annotations={key: "0"}),
                             user="tenant")
        assert code == 403, msg
        assert f"gpushare: annotation(s) {key} say which GPUs a pod holds; only the gpushare scheduler extender and " \
               "the node daemon of the pod's own node may set them (request by tenant)" in msg


def test_a_tenant_cannot_set_change_or_remove_them_later_but_may_set_others(api: Api) -> None:
    path = f"/api/v1/namespaces/{NS}/pods/on-a"
    assert api.call("PATCH", path, _annotate(ALLOCATED, '{"containers":{}}'), user="tenant")[0] == 403
    assert api.call("PATCH", path, _annotate("team", "ml"), user="tenant") == (200, "")
    daemon_a = api.token("gpushare-devplugin", node="node-a")
    assert api.call("PATCH", path, _annotate(ALLOCATED, "{}"), token=daemon_a) == (200, "")
    code, msg = api.call("PATCH", path, _annotate(ALLOCATED, None), user="tenant")
    assert code == 403 and "gpushare.io/allocated" in msg


def test_the_extenders_binding_may_carry_its_choice(api: Api) -> None:
    assert api.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod("pending"), user="tenant")[0] == 201
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "pending", "namespace": NS, "annotations": {"gpushare.io/scheduled": "{}"}},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
    extender = api.token("devplugin-scheduler")
    assert api.call("POST", f"/api/v1/namespaces/{NS}/pods/pending/binding", binding, token=extender) == (201, "")
    pod = json.loads(api.kubectl("-n", NS, "get", "pod", "pending", "-o", "json"))
    assert pod["spec"]["nodeName"] == "node-a" and pod["metadata"]["annotations"]["gpushare.io/scheduled"] == "{}"


def test_a_node_daemon_token_patches_its_own_node_and_pods_only(api: Api) -> None:
    daemon_a = api.token("gpushare-devplugin", node="node-a")
    assert api.call("PATCH", "/api/v1/nodes/node-a", _annotate("gpushare.io/gpus", "{}"), token=daemon_a) == (200, "")
    code, msg = api.call("PATCH", "/api/v1/nodes/node-b", {"metadata": {"labels": {"evil": "1"}}}, token=daemon_a)
    assert (code, msg.split("denied request: ")[-1]) == (
        403, "gpushare: the node daemon of node node-a may patch only its own Node, not node-b")
    # (an annotation of its own: the project's would be refused by both policies, in either order)
    code, msg = api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/on-b", _annotate("node-a-was-here", "1"),
                         token=daemon_a)
    assert (code, msg.split("denied request: ")[-1]) == (
        403, f"gpushare: the node daemon of node node-a may patch only pods bound to it, not {NS}/on-b")


def test_a_node_daemon_token_that_names_no_node_is_refused(api: Api) -> None:
    unbound = api.token("gpushare-devplugin")
    code, msg = api.call("PATCH", "/api/v1/nodes/node-a", _annotate("gpushare.io/gpus", "{}"), token=unbound)
    assert code == 403 and "run it with a pod-bound projected ServiceAccount token" in msg
