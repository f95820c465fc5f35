"""`devplugin serve --metrics-auth kubernetes` against the real kube-apiserver (1.36, e2e/bin): the daemon, with its
own ServiceAccount's token and the RBAC of deploy/base/rbac.yaml, asks the apiserver about each scraper's bearer
token (TokenReview, SubjectAccessReview on GET /metrics). The gpushare-metrics-reader of
deploy/base gets the figures; a tenant's ServiceAccount gets 403 naming it; no token, or one the
apiserver did not issue, gets 401. A daemon whose ServiceAccount may not review tokens refuses everyone (503).
`kubectl inspect gpushare` reads the figures through the apiserver's pod proxy, which drops the Authorization
header: with a token of the reader from a TokenRequest in X-Forwarded-Access-Token, which the proxy passes on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from tests.app.test_serve_process import serve
from tests.realk8s import kubeconfigs
from tests.realk8s.apiserver import bare_apiserver
from tests.support.daemon_harness import COUNT, _until

REPO = Path(__file__).resolve().parents[3]
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
pytestmark = pytest.mark.realk8s
ADMIN = "admintoken"


@dataclass
class Cluster:
    root: Path
    server: str
    admin: Path

    def kubectl(self, *args: str, stdin: str = "") -> str:
        proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.admin), *args], input=stdin,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def proxy(self, path: str) -> tuple[int, str]:
        """GET through the apiserver as the admin (whose Authorization the apiserver consumes)."""
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {ADMIN}"})
        try:
            with urllib.request.urlopen(req, context=ssl._create_unverified_context(), timeout=10) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode()

    def token(self, namespace: str, account: str) -> str:
        return self.kubectl("-n", namespace, "create", "token", account).strip()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="gs-mauth-", dir="/tmp"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        bare = cleanup.enter_context(bare_apiserver(root, ADMIN, timeout=90))
        c = Cluster(root, bare.server, bare.kubeconfig)
        c.kubectl("apply", "-f", str(REPO / "deploy/base/rbac.yaml"),
                  "-f", str(REPO / "deploy/base/metrics-reader.yaml"),
                  "-f", str(REPO / "deploy/components/dra-node/rbac.yaml"))
        c.kubectl("create", "namespace", "team-a")
        c.kubectl("-n", "team-a", "create", "serviceaccount", "default")  # no controller-manager runs
        c.kubectl("-n", "kube-system", "create", "serviceaccount", "unprivileged")
        c.kubectl("-n", "kube-system", "create", "serviceaccount", "default")
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, token: str = "") -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()
    except OSError:
        return 0, ""


def daemon_as(c: Cluster, account: str, root: Path, *more: str) -> tuple[subprocess.Popen, str, KubeletEmulator]:
    """`devplugin serve` with `account`'s token in its kubeconfig and --metrics-auth kubernetes; (process,
    metrics URL, kubelet)."""
    kubeconfig = kubeconfigs.write(root / f"{account}.kubeconfig", c.server, None, account,
                                   token=c.token("kube-system", account))
    driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
    kubelet = KubeletEmulator(root / "dp", root / "pr.sock")
    kubelet.start()
    port = free_port()
    proc = serve(driver, root, "--mode", "cgpu", "--node-name", "", "--kubeconfig", str(kubeconfig),
                 "--metrics-port", str(port), "--metrics-auth", "kubernetes", *more)
    assert kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 2, timeout=30)
    return proc, f"http://127.0.0.1:{port}/metrics", kubelet


def stop(proc: subprocess.Popen, kubelet: KubeletEmulator) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    kubelet.stop()
    assert proc.returncode == 0, out
    return str(out)


def test_only_a_token_allowed_get_on_metrics_reads_the_daemons_figures(cluster: Cluster) -> None:
    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    proc, url, kubelet = daemon_as(cluster, "gpushare-devplugin", root)
    try:
        assert _until(lambda: get(url)[0] == 401, 10)
        reader = cluster.token("kube-system", "gpushare-metrics-reader")
        status, body = get(url, reader)
        assert status == 200, body
        assert "gpushare_resource_registered" in body
        status, body = get(url, cluster.token("team-a", "default"))
        assert status == 403, body
        assert "system:serviceaccount:team-a:default may not get /metrics" in body
        assert "gpushare_" not in body
        status, body = get(url, reader[:-4] + "abcd")  # a token the apiserver did not sign
        assert status == 401 and "the apiserver does not know this token" in body
        status, body = get(url)
        assert status == 401 and "gpushare_" not in body
    finally:
        stop(proc, kubelet)
        shutil.rmtree(root, ignore_errors=True)


def test_a_daemon_that_may_not_review_tokens_refuses_every_scrape(cluster: Cluster) -> None:
    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    proc, url, kubelet = daemon_as(cluster, "unprivileged", root)
    try:
        assert _until(lambda: get(url)[0] == 401, 10)
        status, body = get(url, cluster.token("kube-system", "gpushare-metrics-reader"))
        assert status == 503 and "cannot check the token with the apiserver" in body and "gpushare_" not in body
    finally:
        out = stop(proc, kubelet)
        shutil.rmtree(root, ignore_errors=True)
    # the log says why: the apiserver's refusal names what the daemon may not create
    assert "cannot check a token with the apiserver: TokenReview: HTTP 403 Forbidden" in out
    assert 'cannot create resource \\"tokenreviews\\"' in out or 'cannot create resource "tokenreviews"' in out


def host_address() -> str:
    """An address of this host other than loopback (the apiserver's pod proxy refuses loopback), or ''."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = str(s.getsockname()[0])
        except OSError:
            return ""
    return "" if address.startswith("127.") else address


def test_inspect_reads_the_figures_through_the_pod_proxy_with_a_reader_token(cluster: Cluster) -> None:
    from devplugin.inspect.use import read_use
    from devplugin.kube.client import load_api_client

    address = host_address()
    if not address:
        pytest.skip("this host has no address but loopback, which the apiserver's pod proxy refuses")
    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    proc, url, kubelet = daemon_as(cluster, "gpushare-devplugin", root, "--metrics-address", "0.0.0.0")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        assert _until(lambda: get(url)[0] == 401, 10)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "gpushare-devplugin-x1", "namespace": "kube-system",
                            "labels": {"app": "gpushare-devplugin"}},
               "spec": {"nodeName": "node-x", "containers": [{
                   "name": "devplugin", "image": "gpushare/devplugin:0.1.0",
                   "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]}]}}
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
        cluster.kubectl("-n", "kube-system", "patch", "pod", "gpushare-devplugin-x1", "--subresource", "status",
                        "--type", "merge", "-p", json.dumps({"status": {
                            "phase": "Running", "podIP": address, "podIPs": [{"ip": address}]}}))
        use = read_use(load_api_client(str(cluster.admin)), ["node-x"])["node-x"]
        assert use.error == "" and use.containers == []  # answered (no container holds a GPU there)
        # without the token the proxy passes on, the daemon refuses what the apiserver let through
        status, body = cluster.proxy(f"/api/v1/namespaces/kube-system/pods/gpushare-devplugin-x1:{port}/proxy/metrics")
        assert status == 401 and "gpushare_" not in body
    finally:
        cluster.kubectl("-n", "kube-system", "delete", "pod", "gpushare-devplugin-x1", "--ignore-not-found",
                        "--wait=false")
        stop(proc, kubelet)
        shutil.rmtree(root, ignore_errors=True)


def test_the_dra_plugin_answers_the_reader_alone(cluster: Cluster) -> None:
    """`devplugin dra` with its own ServiceAccount and the RBAC of deploy/components/dra-node: the same check (its
    metrics answer before the kubelet registers it)."""
    root = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    kubeconfig = kubeconfigs.write(root / "dra.kubeconfig", cluster.server, None, "gpushare-dra-plugin",
                                   token=cluster.token("kube-system", "gpushare-dra-plugin"))
    driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "devplugin", "dra", "--node-name", "node-x", "--kubeconfig", str(kubeconfig),
         "--plugins-registry-dir", str(root / "reg"), "--plugin-dir", str(root / "plug"), "--cdi-dir",
         str(root / "cdi"), "--shim", "off", "--shim-state-dir", str(root / "shim"), "--state-dir",
         str(root / "state"), "--health-port", "0", "--metrics-port", str(port), "--metrics-auth", "kubernetes"],
        env={**os.environ, **driver.env()}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        assert _until(lambda: get(url)[0] == 401, 20), "no metrics port"
        status, body = get(url, cluster.token("kube-system", "gpushare-metrics-reader"))
        assert status == 200 and "gpushare_dra_prepared_claims" in body, body
        status, body = get(url, cluster.token("team-a", "default"))
        assert status == 403 and "system:serviceaccount:team-a:default may not get /metrics" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        shutil.rmtree(root, ignore_errors=True)
    assert proc.returncode == 0, out
