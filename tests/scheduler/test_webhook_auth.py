"""With --webhook-client-names the webhooks answer only the apiserver's client certificate (what its
AdmissionConfiguration kubeconfig presents): an anonymous post, or one with kube-scheduler's certificate, gets 403
with the reason before its body is read; without the flag the webhooks answer anyone (test_auth.py)."""

from __future__ import annotations

import argparse
import shutil
import socket
import ssl
from collections.abc import Iterator

import pytest

from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.service import add_arguments, check_arguments, server_config
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_auth import Served
from tests.scheduler.test_extender import FakeCluster
from tests.scheduler.test_http import review
from tests.scheduler.tls_certs import make_ca, make_leaf
from tests.scheduler.uvicorn_thread import serving_on_a_free_port
from tests.support.scheduler_objects import node, pod

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for test certs")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("webhook-mtls")
    ca = make_ca(d, "cluster-ca")
    server = make_leaf(d, ca, "devplugin-scheduler.kube-system.svc", "serverAuth", ("localhost",))
    certs = {"kube-apiserver": make_leaf(d, ca, "kube-apiserver", "clientAuth"),
             "kube-scheduler": make_leaf(d, ca, "kube-scheduler", "clientAuth")}
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=2, units=16)])
    state.replace_pods([])
    config = server_config(build_app(Service(state, FakeCluster(state), max_body=1 << 20)), "127.0.0.1", 0,
                           str(server[0]), str(server[1]), str(ca[0]), ["kube-scheduler"], ["kube-apiserver"])
    with serving_on_a_free_port(config) as port:
        yield Served(f"https://localhost:{port}", ca[0], certs, state)


def test_the_apiservers_certificate_is_answered(served: Served) -> None:
    with served.client("kube-apiserver") as c:
        for hook in ("validate", "mutate"):
            r = c.post(f"{served.url}/admission/{hook}", json=review(pod(mem=4)))
            assert r.status_code == 200 and r.json()["response"]["allowed"] is True, r.text


def test_an_anonymous_caller_is_refused_before_its_body_is_read(served: Served) -> None:
    with served.client(None) as c:
        r = c.post(f"{served.url}/admission/validate", json=review(pod(mem=4)))
        assert r.status_code == 403
        assert r.json()["error"] == (
            "the webhooks answer only the apiserver: present a client certificate signed by the CA of "
            "--client-ca-file and naming one of: kube-apiserver (the apiserver's AdmissionConfiguration kubeconfig, "
            "docs/guide/install.md)")
    # a 30 MiB declared body is answered at once, from its headers: nothing of it is read
    ctx = ssl.create_default_context(cafile=str(served.ca))
    port = int(served.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(b"POST /admission/mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                    b"content-length: 31457280\r\n\r\n{")
        answer = tls.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403 "), answer[:100]


def test_kube_schedulers_certificate_does_not_open_the_webhooks(served: Served) -> None:
    with served.client("kube-scheduler") as c:
        r = c.post(f"{served.url}/admission/validate", json=review(pod(mem=4)))
        assert r.status_code == 403
        assert r.json()["error"] == ("client certificate names kube-scheduler, which may not call the webhooks; "
                                     "allowed: kube-apiserver (--webhook-client-names)")
        # and its own verbs stay open to it, the probes to anyone
        r = c.post(f"{served.url}/scheduler/filter", json={"Pod": pod(mem=1), "NodeNames": ["n1"]})
        assert r.status_code == 200 and r.json()["NodeNames"] == ["n1"]
    with served.client(None) as c:
        assert c.get(f"{served.url}/healthz").text == "ok"


def test_webhook_client_names_need_a_client_ca() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--plain-http", "--webhook-client-names", "kube-apiserver"])
    assert check_arguments(args) == ("--webhook-client-names needs TLS with --client-ca-file: callers are named by "
                                     "their client certificate, which --plain-http cannot check")
    assert check_arguments(p.parse_args(["--plain-http", "--max-concurrent-reviews", "0"])) == (
        "--max-concurrent-reviews 0: must be a positive number")
