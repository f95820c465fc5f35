"""The admission policies of deploy/base/admission-policies.yaml, evaluated by the real kube-apiserver (1.36, from
e2e/bin): a tenant cannot write the project's pod annotations, the extender's ServiceAccount can (through the
Binding it creates), and a node daemon's pod-bound token of node A can patch node A and A's pods only; another GPU
scheduler's choice annotations (Alibaba's, ACK's) are written only by the users listed in the ConfigMap
kube-system/gpushare-annotation-writers, which the cluster can extend without touching the policy.

A bare apiserver (etcd and kube-apiserver; RBAC on; static tokens for the admin) is enough: the policies are the
apiserver's own CEL, nothing of the project's code runs."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realk8s.apiserver import bare_apiserver

REPO = Path(__file__).resolve().parents[3]
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
pytestmark = pytest.mark.realk8s
ADMIN = "admintoken"
NS = "tenant-a"


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
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        bare = cleanup.enter_context(bare_apiserver(root, ADMIN, timeout=90))
        a = Api(bare.server, bare.kubeconfig)
        deadline = time.monotonic() + 90
        a.kubectl("apply", "-f", str(REPO / "deploy/base/rbac.yaml"), "-f", str(REPO / "deploy/scheduler/rbac.yaml"),
                  "-f", str(REPO / "deploy/base/admission-policies.yaml"))
        for node in ("node-a", "node-b"):
            a.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                            "metadata": {"name": node}}))
        a.kubectl("create", "namespace", NS)
        a.kubectl("-n", NS, "create", "serviceaccount", "default")  # no controller-manager runs
        a.kubectl("-n", NS, "create", "role", "tenant", "--verb=create,get,patch,update", "--resource=pods")
        a.kubectl("-n", NS, "create", "rolebinding", "tenant", "--role=tenant", "--user=tenant")
        # what the other GPU schedulers' own RBAC grants them: patch pods and bind them
        a.kubectl("-n", NS, "create", "role", "scheduler", "--verb=get,patch", "--resource=pods")
        a.kubectl("-n", NS, "create", "role", "binder", "--verb=create", "--resource=pods/binding")
        for role in ("scheduler", "binder"):
            a.kubectl("-n", NS, "create", "rolebinding", role, f"--role={role}", f"--user={KUBE_SCHEDULER}",
                      f"--user={ALIBABA_EXTENDER}", f"--user={OTHER_SCHEDULER}")
        for node in ("a", "b"):
            assert a.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod(f"on-{node}", f"node-{node}"),
                          user="tenant")[0] == 201
        # a policy takes effect once the apiserver has compiled it: wait until a forged pod is refused by each
        for key in (ALLOCATED, ALIYUN_IDX):
            while a.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod("probe", annotations={key: "0"}),
                         user="tenant")[0] == 201:
                a.kubectl("-n", NS, "delete", "pod", "probe", "--wait=false")
                assert time.monotonic() < deadline, f"the admission policy on {key} never took effect"
                time.sleep(0.5)
        yield a


ALLOCATED = "gpushare.io/allocated"
ALIYUN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ACK_ALLOCATION = "scheduler.framework.gpushare.allocation"
KUBE_SCHEDULER = "system:kube-scheduler"  # ACK's scheduler plugins run inside kube-scheduler
ALIBABA_EXTENDER = "system:serviceaccount:kube-system:gpushare-schd-extender"  # Alibaba's deploy YAML
WRITERS = "gpushare-annotation-writers"
OTHER_SCHEDULER = "system:serviceaccount:gpu-system:volcano-scheduler"  # not listed by default


def _pod(name: str, node: str = "", annotations: dict[str, str] | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": spec}


def _annotate(key: str, value: str | None) -> dict:
    return {"metadata": {"annotations": {key: value}}}


def test_a_tenant_cannot_create_a_pod_with_the_projects_annotations(api: Api) -> None:
    for key in (ALLOCATED, "gpushare.io/scheduled"):
        code, msg = api.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod("forger", annotations={key: "0"}),
                             user="tenant")
        assert code == 403, msg
        assert f"gpushare: annotation(s) {key} say which GPUs a pod holds; only the gpushare scheduler extender and " \
               "the node daemon of the pod's own node may set them (request by tenant)" in msg


def _third_party_refusal(keys: str, user: str) -> str:
    return (f"gpushare: annotation(s) {keys} are another GPU scheduler's choice; only the users listed in ConfigMap "
            f"kube-system/{WRITERS} (key usernames), the gpushare scheduler extender and the node daemon of the "
            f"pod's own node may set them (request by {user}); remove them from the pod (or its template), or add "
            "the scheduler that writes them to that ConfigMap")


def test_a_tenant_cannot_write_another_schedulers_choice(api: Api) -> None:
    for key in (ALIYUN_IDX, "ALIYUN_COM_GPU_MEM_ASSUME_TIME", ACK_ALLOCATION,
                "gpushare.alibabacloud.com/core-percentage", "scheduler.framework.gpushare.assigned"):
        code, msg = api.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod("forger", annotations={key: "0"}),
                             user="tenant")
        assert (code, msg.split("denied request: ")[-1]) == (403, _third_party_refusal(key, "tenant"))
    code, msg = api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/on-a", _annotate(ACK_ALLOCATION, '{"0":{"3":8}}'),
                         user="tenant")
    assert (code, msg.split("denied request: ")[-1]) == (403, _third_party_refusal(ACK_ALLOCATION, "tenant"))


def test_the_listed_schedulers_write_their_choice_at_bind_but_not_the_projects(api: Api) -> None:
    """As Alibaba's extender and ACK's plugins do at bind: patch the pending pod's annotations, then bind it."""
    for name, user, choice in (("alibaba", ALIBABA_EXTENDER, {ALIYUN_IDX: "3", "ALIYUN_COM_GPU_MEM_POD": "12",
                                                               "ALIYUN_COM_GPU_MEM_ASSIGNED": "false"}),
                               ("ack", KUBE_SCHEDULER, {ACK_ALLOCATION: '{"0":{"5":12}}',
                                                        "scheduler.framework.gpushare.assigned": "false"})):
        assert api.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod(name), user="tenant")[0] == 201
        path = f"/api/v1/namespaces/{NS}/pods/{name}"
        assert api.call("PATCH", path, {"metadata": {"annotations": choice}}, user=user) == (200, "")
        code, msg = api.call("PATCH", path, _annotate(ALLOCATED, "{}"), user=user)
        assert code == 403 and f"(request by {user})" in msg and "say which GPUs a pod holds" in msg, msg
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": NS},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
        assert api.call("POST", f"{path}/binding", binding, user=user) == (201, "")
        pod = json.loads(api.kubectl("-n", NS, "get", "pod", name, "-o", "json"))
        assert pod["spec"]["nodeName"] == "node-a"
        assert {k: pod["metadata"]["annotations"][k] for k in choice} == choice
    # the node daemon of the pod's node marks Alibaba's choice as placed
    daemon_a = api.token("gpushare-devplugin", node="node-a")
    assert api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/alibaba",
                    _annotate("ALIYUN_COM_GPU_MEM_ASSIGNED", "true"), token=daemon_a) == (200, "")


def test_another_scheduler_is_allowed_by_adding_its_user_to_the_configmap(api: Api) -> None:
    other = OTHER_SCHEDULER
    path = f"/api/v1/namespaces/{NS}/pods/on-b"
    code, msg = api.call("PATCH", path, _annotate(ALIYUN_IDX, "1"), user=other)
    assert (code, msg.split("denied request: ")[-1]) == (403, _third_party_refusal(ALIYUN_IDX, other))
    writers = json.loads(api.kubectl("-n", "kube-system", "get", "configmap", WRITERS, "-o", "json"))
    usernames = writers["data"]["usernames"]
    api.kubectl("-n", "kube-system", "patch", "configmap", WRITERS, "--type=merge",
                "-p", json.dumps({"data": {"usernames": usernames + f"  {other}  \n"}}))
    try:
        deadline = time.monotonic() + 30  # the apiserver reads the parameter from its informer
        while (result := api.call("PATCH", path, _annotate(ALIYUN_IDX, "1"), user=other))[0] == 403:
            assert time.monotonic() < deadline, result
            time.sleep(0.3)
        assert result == (200, "")
    finally:
        api.kubectl("-n", "kube-system", "patch", "configmap", WRITERS, "--type=merge",
                    "-p", json.dumps({"data": {"usernames": usernames}}))


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
