"""The real kube-apiserver (1.36, e2e/bin) presents a client certificate to the webhooks through its
AdmissionConfiguration, as docs/guide/install.md shows, and `devplugin scheduler --webhook-client-names kube-apiserver`
answers it: a pod setting CUDA_VISIBLE_DEVICES is denied with the webhook's own message, an ordinary pod is created
with NVIDIA_VISIBLE_DEVICES=void added, while an anonymous post to the same webhook gets 403."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import tempfile
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.realk8s import kubeconfigs
from tests.realk8s.apiserver import apiserver_flags, start_etcd
from tests.realk8s.binaries import binary
from tests.realk8s.certs import Pki, make_pki, service_account_keys
from tests.realk8s.processes import Proc, free_port

pytestmark = pytest.mark.realk8s
REPO = Path(__file__).resolve().parents[3]
ADMIN = "admintoken"
NS = "tenant-a"


def admission_configuration(directory: Path, webhook_host: str, pki: Pki) -> Path:
    """The AdmissionConfiguration of docs/guide/install.md: both webhook plugins read one kubeconfig whose user, named
    after the webhook's host (here host:port of its URL; in a cluster the Service's DNS name), holds the client
    certificate the apiserver presents."""
    cert = pki.issue("kube-apiserver-webhook-client", "kube-apiserver")
    kubeconfig = directory / "webhook-kubeconfig.yaml"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": webhook_host, "user": {"client-certificate": str(cert.cert),
                                                  "client-key": str(cert.key)}}]}))
    config = directory / "admission-configuration.yaml"
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig)}
    config.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                    {"name": "MutatingAdmissionWebhook", "configuration": plugin}]}))
    return config


@dataclass
class Cluster:
    server: str
    service: str  # https://127.0.0.1:PORT of devplugin scheduler
    ca: Path

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        ctx = ssl._create_unverified_context()  # the apiserver's own self-signed certificate
        req = urllib.request.Request(self.server + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                status, text = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, text = err.code, err.read()
        return status, json.loads(text) if text.startswith(b"{") else {"text": text.decode()}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gs-whauth-", dir="/tmp"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        pki = make_pki(root / "pki")
        service_port = free_port()
        host = f"127.0.0.1:{service_port}"
        serving = pki.issue("devplugin-scheduler", "devplugin-scheduler", ips=("127.0.0.1",), server=True)
        sa = service_account_keys(root)
        (root / "tokens.csv").write_text(f"{ADMIN},admin,1,system:masters\n")
        etcd, etcd_url = start_etcd(binary("etcd"), root / "etcd", root / "logs" / "etcd.log")
        cleanup.callback(etcd.stop)
        port = free_port()
        server = f"https://127.0.0.1:{port}"
        api = Proc("kube-apiserver", [str(binary("kube-apiserver")), *apiserver_flags(etcd_url, port, sa),
                                      f"--cert-dir={root / 'certs'}", f"--token-auth-file={root / 'tokens.csv'}",
                                      "--authorization-mode=RBAC",
                                      f"--admission-control-config-file={admission_configuration(root, host, pki)}"],
                   root / "logs" / "kube-apiserver.log")
        cleanup.callback(api.stop)
        c = Cluster(server, f"https://{host}", pki.ca.cert)
        api.start().wait_until(lambda: c.call("GET", "/readyz")[0] == 200, "ready (/readyz)", 120)
        admin = kubeconfigs.write(root / "admin.kubeconfig", server, None, "admin", token=ADMIN)
        service = Proc("devplugin-scheduler", [
            sys.executable, "-m", "devplugin", "scheduler", "--address", "127.0.0.1", "--port", str(service_port),
            "--tls-cert-file", str(serving.cert), "--tls-private-key-file", str(serving.key),
            "--client-ca-file", str(pki.ca.cert), "--webhook-client-names", "kube-apiserver",
            "--kubeconfig", str(admin), "--log-format", "json"], root / "logs" / "devplugin-scheduler.log",
            env={**os.environ, "PYTHONPATH": str(REPO)})
        cleanup.callback(service.stop)
        service.start().wait_for_line("scheduler extender and webhooks listening", 60)
        bundle = b64encode(pki.ca.cert.read_bytes()).decode()
        rules = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
        for kind, hook, path, policy in (("ValidatingWebhookConfiguration", "validate.gpushare.io", "validate", "Fail"),
                                         ("MutatingWebhookConfiguration", "visible-devices.gpushare.io", "mutate",
                                          "Ignore")):
            plural = kind.lower() + "s"
            status, out = c.call("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}", {
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "gpushare"},
                "webhooks": [{"name": hook, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                              "failurePolicy": policy, "timeoutSeconds": 5, "rules": rules,
                              "clientConfig": {"url": f"{c.service}/admission/{path}", "caBundle": bundle},
                              "namespaceSelector": {"matchExpressions": [{
                                  "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                  "values": ["kube-system"]}]}}]})
            assert status == 201, out
        for path, body in (("/api/v1/namespaces", {"metadata": {"name": NS}}),
                           (f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "default"}})):
            status, out = c.call("POST", path, body)
            assert status == 201, out
        yield c


def a_pod(name: str, env: dict[str, str] | None = None) -> dict:
    container: dict = {"name": "main", "image": "cuda"}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "automountServiceAccountToken": False}}


def test_the_apiserver_presents_its_certificate_and_the_webhooks_answer_it(cluster: Cluster) -> None:
    pods = f"/api/v1/namespaces/{NS}/pods"
    status, out = cluster.call("POST", pods, a_pod("sees-all", {"CUDA_VISIBLE_DEVICES": "0"}))
    assert status == 403, out
    assert 'admission webhook "validate.gpushare.io" denied the request' in out["message"]
    assert "sets env CUDA_VISIBLE_DEVICES, which only the node daemon may set" in out["message"]
    status, out = cluster.call("POST", pods, a_pod("plain"))
    assert status == 201, out
    assert out["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_an_anonymous_post_to_the_webhook_is_refused(cluster: Cluster) -> None:
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                          "namespace": NS, "object": a_pod("x")}}
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cluster.ca)), timeout=30) as anonymous:
        r = anonymous.post(f"{cluster.service}/admission/validate", json=review)
    assert r.status_code == 403, r.text
    assert r.json()["error"].startswith("the webhooks answer only the apiserver")
