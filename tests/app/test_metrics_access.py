"""Who can read the node daemon's figures. The health port, open to every address because the kubelet probes the
pod's IP, answers the probes only: the per-GPU and per-container figures (every tenant's namespace, pod and
container names and GPU use) are on the metrics port, which listens on loopback unless told otherwise and, with
`--metrics-auth kubernetes`, answers only a bearer token the apiserver authenticates (TokenReview) and allows
`get` on the non-resource URL /metrics (SubjectAccessReview), as kube-rbac-proxy does.

The reviews are asked of the real apiserver in tests/realk8s/app/test_metrics_auth.py; here the checks around them
(the answers, the cache, an apiserver that fails) run against plain functions in their place."""

from __future__ import annotations

import shutil
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from tests.app.test_serve_process import serve
from tests.support.daemon_harness import COUNT, Running, _until, running, short_dir
from tests.support.shim_probe import SHIM, require_built

TENANT_POD = "team-a-secret-project"


def get(url: str, token: str = "") -> tuple[int, str, dict[str, str]]:
    """(status, body, headers by lower-case name) of one GET; status 0 when the connection is refused."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status), resp.read().decode(), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(), {k.lower(): v for k, v in err.headers.items()}
    except OSError:
        return 0, "", {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def held(api: FakeApiserver) -> Iterator[Running]:
    """The daemon with the shim delivered and one tenant container holding a share of a GPU."""
    require_built()
    with running(apiserver=api, health_port=0, shim="on", shim_lib=str(SHIM)) as r:
        assert r.registered_all()
        pod = r.pod(TENANT_POD, mem=2, core=50)
        assert r.wait_cached(pod)
        r.admit(pod)
        yield r


def test_the_open_health_port_serves_the_probes_and_no_tenant_names(held: Running) -> None:
    status, body, _ = get(held.http_url + "/metrics")
    assert status == 404 and TENANT_POD not in body and "gpushare_" not in body
    assert "/metrics is on the metrics port" in body
    assert get(held.http_url + "/healthz")[:2] == (200, "ok\n")
    assert get(held.http_url + "/readyz")[:2] == (200, "ok\n")


def test_the_metrics_port_has_the_per_container_series(held: Running) -> None:
    status, body, _ = get(held.metrics_url + "/metrics")
    assert status == 200
    assert f'gpushare_container_memory_limit_bytes{{node="gpu-node",namespace="default",pod="{TENANT_POD}"' in body
    assert "gpushare_gpu_memory_allocated_units" in body


def test_the_metrics_port_listens_on_loopback_unless_told_otherwise() -> None:
    for address, from_a_pod in (("", 0), ("0.0.0.0", 200)):
        root = short_dir()
        port = free_port()
        try:
            driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
            with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
                more = ("--metrics-address", address) if address else ()
                proc = serve(driver, root, "--mode", "cgpu", "--node-name", "", "--metrics-port", str(port), *more)
                try:
                    assert kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 2, timeout=20)
                    assert _until(lambda p=port: get(f"http://127.0.0.1:{p}/metrics")[0] == 200, 10)
                    assert "gpushare_resource_registered" in get(f"http://127.0.0.1:{port}/metrics")[1]
                    # another address of the host (a pod reaches the daemon's pod IP, never its loopback)
                    assert get(f"http://127.0.0.2:{port}/metrics")[0] == from_a_pod, address
                finally:
                    proc.send_signal(signal.SIGTERM)
                    out, _ = proc.communicate(timeout=15)
                assert proc.returncode == 0, out
                if address:
                    assert "per-container metrics (namespace, pod and container names) are served to anyone " \
                           "who reaches 0.0.0.0" in out
        finally:
            shutil.rmtree(root, ignore_errors=True)


def test_serve_refuses_one_port_for_both() -> None:
    root = short_dir()
    try:
        proc = serve(FakeDriver.create(root / "drv", seed_node(1, 15360)), root,
                     "--health-port", "8089", "--metrics-port", "8089")
        out, _ = proc.communicate(timeout=30)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert proc.returncode == 2
    assert "--metrics-port 8089 is --health-port's too" in out


# ------------------------------------------------------------------ the bearer-token check, reviews in place

class Reviews:
    """TokenReview and SubjectAccessReview in place: tokens -> users, users allowed GET /metrics; counts calls."""

    def __init__(self) -> None:
        self.users = {"reader-token": "system:serviceaccount:monitoring:prometheus",
                      "tenant-token": "system:serviceaccount:team-a:default"}
        self.allowed = {"system:serviceaccount:monitoring:prometheus"}
        self.calls = {"authenticate": 0, "authorize": 0}
        self.down = False
        self.lock = threading.Lock()

    def authenticate(self, token: str) -> object:
        from devplugin.app.metrics_auth import ApiserverError, User

        with self.lock:
            self.calls["authenticate"] += 1
        if self.down:
            raise ApiserverError("TokenReview: connection refused")
        name = self.users.get(token)
        return User(name=name, uid="u-" + name, groups=("system:serviceaccounts",)) if name else None

    def authorize(self, user: object) -> tuple[bool, str]:
        with self.lock:
            self.calls["authorize"] += 1
        name = user.name  # type: ignore[attr-defined]
        return (True, "") if name in self.allowed else (False, "no RBAC policy matched")


@pytest.fixture
def guarded() -> Iterator[tuple[str, Reviews]]:
    from devplugin.app.metrics_auth import TokenCheck
    from devplugin.app.metrics_server import metrics_server

    reviews = Reviews()
    check = TokenCheck(reviews.authenticate, reviews.authorize)  # type: ignore[arg-type]
    server = metrics_server("127.0.0.1", 0, lambda: b"gpushare_up 1\n", check).start()
    try:
        yield f"http://127.0.0.1:{server.port}/metrics", reviews
    finally:
        server.stop()


def test_metrics_without_a_token_or_with_an_unknown_one_get_401(guarded: tuple[str, Reviews]) -> None:
    url, _ = guarded
    status, body, headers = get(url)
    assert status == 401 and headers.get("www-authenticate", "").startswith("Bearer")
    assert "Authorization: Bearer" in body and "gpushare_up" not in body
    status, body, _ = get(url, "forged")
    assert status == 401 and "the apiserver does not know this token" in body


def test_a_user_not_allowed_get_on_metrics_gets_403_naming_it(guarded: tuple[str, Reviews]) -> None:
    url, _ = guarded
    status, body, _ = get(url, "tenant-token")
    assert status == 403 and "gpushare_up" not in body
    assert "system:serviceaccount:team-a:default may not get /metrics" in body
    assert 'nonResourceURLs: ["/metrics"]' in body


def test_an_allowed_scraper_gets_the_figures_and_its_token_is_reviewed_once_a_minute(
        guarded: tuple[str, Reviews]) -> None:
    url, reviews = guarded
    for _ in range(5):
        assert get(url, "reader-token")[:2] == (200, "gpushare_up 1\n")
    assert reviews.calls == {"authenticate": 1, "authorize": 1}
    for _ in range(3):  # a refusal is remembered too, a shorter while
        assert get(url, "tenant-token")[0] == 403
    assert reviews.calls == {"authenticate": 2, "authorize": 2}


def test_an_apiserver_that_cannot_review_gives_503_and_no_remembered_answer(guarded: tuple[str, Reviews]) -> None:
    url, reviews = guarded
    reviews.down = True
    status, body, _ = get(url, "reader-token")
    assert status == 503 and "cannot check the token with the apiserver" in body
    assert "connection refused" not in body  # the reason is logged, not told to a caller not known yet
    reviews.down = False
    assert get(url, "reader-token")[0] == 200


def test_the_cache_of_answers_is_bounded() -> None:
    from devplugin.app.metrics_auth import MAX_REMEMBERED, TokenCheck, User

    check = TokenCheck(lambda token: User(name=token), lambda user: (True, ""))
    for i in range(MAX_REMEMBERED * 3):
        assert check.verdict(f"token-{i}").status == 200
    assert len(check.remembered) <= MAX_REMEMBERED


# ------------------------------------------------------------------ the manifests

def test_the_daemonset_serves_metrics_to_reviewed_tokens_and_pods_reach_that_port_only(tmp_path: object) -> None:
    import os
    import textwrap
    from pathlib import Path

    import yaml

    from tests.support.deploy_render import DEPLOY, overlay, render_text

    objects = overlay("node-only")
    ds = next(o for o in objects if o["kind"] == "DaemonSet")
    (daemon,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in daemon["env"]}
    ports = {p["name"]: p["containerPort"] for p in daemon["ports"]}
    assert (env["DEVPLUGIN_METRICS_ADDRESS"], env["DEVPLUGIN_METRICS_AUTH"]) == ("0.0.0.0", "kubernetes")
    assert ports == {"health": int(env["DEVPLUGIN_HEALTH_PORT"]), "metrics": int(env["DEVPLUGIN_METRICS_PORT"])}
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]  # not the probes'
    # the PodMonitor scrapes that port as the metrics reader, whose only grant is get /metrics
    mine = Path(str(tmp_path)) / "overlay"
    mine.mkdir()
    rel = os.path.relpath(DEPLOY, mine)
    (mine / "kustomization.yaml").write_text(textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources: [{rel}/overlays/node-only]
        components: [{rel}/components/monitoring]
    """))
    monitored = [d for d in yaml.safe_load_all(render_text(mine)) if d]
    monitor = next(o for o in monitored if o["kind"] == "PodMonitor" and o["metadata"]["name"] == "gpushare-devplugin")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    credentials = endpoint["authorization"]["credentials"]
    secret = next(o for o in monitored if o["kind"] == "Secret" and o["metadata"]["name"] == credentials["name"])
    assert secret["type"] == "kubernetes.io/service-account-token" and credentials["key"] == "token"
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    binding = next(o for o in monitored if o["kind"] == "ClusterRoleBinding"
                   and {"kind": "ServiceAccount", "name": account, "namespace": "kube-system"} in o["subjects"])
    role = next(o for o in monitored
                if o["kind"] == "ClusterRole" and o["metadata"]["name"] == binding["roleRef"]["name"])
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
