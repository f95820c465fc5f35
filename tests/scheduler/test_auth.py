"""Only kube-scheduler may call the extender's verbs: real TLS clients (httpx) against the served app, with
kube-scheduler's client certificate, none, one from another CA and one naming someone else; the webhooks and the
probes answer without a client certificate. Bodies over the bound get 413 while a real review is answered."""

from __future__ import annotations

import json
import logging
import shutil
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.service import server_config
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster
from tests.scheduler.test_http import review
from tests.scheduler.tls_certs import make_ca, make_leaf
from tests.scheduler.uvicorn_thread import serving_on_a_free_port
from tests.support.scheduler_objects import node, pod

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for test certs")


@dataclass
class Served:
    url: str
    ca: Path
    certs: dict[str, tuple[Path, Path]]
    state: ClusterState

    def client(self, who: str | None = None, **kw: object) -> httpx.Client:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if who is not None:
            ctx.load_cert_chain(*map(str, self.certs[who]))
        return httpx.Client(verify=ctx, timeout=15, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("mtls")
    ca, other_ca = make_ca(d, "cluster-ca"), make_ca(d, "other-ca")
    server = make_leaf(d, ca, "devplugin-scheduler.kube-system.svc", "serverAuth",
                       ("devplugin-scheduler.kube-system.svc", "localhost"))
    certs = {"kube-scheduler": make_leaf(d, ca, "kube-scheduler", "clientAuth"),
             "by-san": make_leaf(d, ca, "someone", "clientAuth", ("kube-scheduler",)),
             "tenant": make_leaf(d, ca, "tenant-a", "clientAuth"),
             "other-ca": make_leaf(d, other_ca, "kube-scheduler", "clientAuth")}
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=2, units=16)])
    state.replace_pods([])
    svc = Service(state, FakeCluster(state), max_body=1 << 20)
    config = server_config(build_app(svc), "127.0.0.1", 0, str(server[0]), str(server[1]), str(ca[0]),
                           ["kube-scheduler"])
    with serving_on_a_free_port(config) as port:
        yield Served(f"https://localhost:{port}", ca[0], certs, state)


def test_kube_scheduler_by_cn_or_san_calls_the_verbs(served: Served) -> None:
    for who in ("kube-scheduler", "by-san"):
        with served.client(who) as c:
            r = c.post(f"{served.url}/scheduler/filter", json={"Pod": pod(mem=20), "NodeNames": ["n1"]})
            assert r.status_code == 200, r.text
            assert r.json()["FailedNodes"] == {"n1": "GPU 0,1: at most 16 GiB free on one GPU, 20 GiB asked"}


def test_a_caller_without_a_certificate_is_refused_with_the_reason(served: Served,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    p = pod("victim", mem=1)
    served.state.upsert_pod(p)
    with caplog.at_level(logging.WARNING), served.client(None) as c:
        for verb in ("filter", "prioritize", "preempt", "bind"):
            body = ({"PodName": "victim", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"}
                    if verb == "bind" else {"Pod": p, "NodeNames": ["n1"]})
            r = c.post(f"{served.url}/scheduler/{verb}", json=body)
            assert r.status_code == 403
            assert "answer only kube-scheduler: present a client certificate" in r.json()["error"]
    assert served.state.held(p["metadata"]["uid"]) is None  # nothing was bound
    assert any(r.getMessage().startswith("caller refused") for r in caplog.records)


def test_a_certificate_naming_someone_else_is_refused(served: Served) -> None:
    with served.client("tenant") as c:
        r = c.post(f"{served.url}/scheduler/filter", json={"Pod": pod(mem=1), "NodeNames": ["n1"]})
    assert r.status_code == 403
    assert r.json()["error"] == ("client certificate names tenant-a, which may not call the extender's verbs; "
                                 "allowed: kube-scheduler (--allowed-client-names)")


def test_a_certificate_from_another_ca_fails_the_handshake(served: Served) -> None:
    # Same name, another CA: TLS refuses it (TLS 1.3 ends the connection once the client's certificate fails to
    # verify), so no HTTP answer at all and nothing reaches the verbs.
    p = pod("by-other-ca", mem=1)
    with served.client("other-ca") as c, pytest.raises(httpx.TransportError):
        c.post(f"{served.url}/scheduler/filter", json={"Pod": p, "NodeNames": ["n1"]})
    assert not served.state.passed_filter(p["metadata"]["uid"], "n1")


def test_webhooks_and_probes_answer_without_a_client_certificate(served: Served) -> None:
    with served.client(None) as c:
        assert c.get(f"{served.url}/healthz").text == "ok"
        r = c.post(f"{served.url}/admission/validate", json=review(pod(mem=4)))
        assert r.status_code == 200 and r.json()["response"]["allowed"] is True
        r = c.post(f"{served.url}/admission/validate", content=b'{"kind": "NotAReview"}')
        assert r.status_code == 400 and "not a valid AdmissionReview" in r.json()["error"]


def test_oversize_posts_get_413_while_a_real_review_is_answered(served: Served) -> None:
    # Two 30 MiB anonymous posts (declared, and streamed without a length) in flight; a real review gets its answer.
    big = 30 << 20
    results: dict[str, object] = {}

    def declared() -> None:
        with served.client(None) as c:
            try:
                results["declared"] = c.post(f"{served.url}/admission/validate",
                                             content=b"{" + b" " * (big - 1)).status_code
            except httpx.TransportError as exc:  # the server may close while the client still sends
                results["declared"] = repr(exc)

    def streamed() -> None:
        def chunks() -> Iterator[bytes]:
            for _ in range(big // (1 << 20)):
                yield b" " * (1 << 20)

        with served.client(None) as c:
            try:
                results["streamed"] = c.post(f"{served.url}/admission/mutate", content=chunks()).status_code
            except httpx.TransportError as exc:
                results["streamed"] = repr(exc)

    threads = [threading.Thread(target=declared), threading.Thread(target=streamed)]
    for t in threads:
        t.start()
    big_pod = pod("large", mem=4, containers=[{"name": f"c{i}", "image": "x" * 200,
                                               "resources": {"limits": {}}} for i in range(500)])
    with served.client(None) as c:
        r = c.post(f"{served.url}/admission/validate", json=review(big_pod))
    assert r.status_code == 200 and r.json()["response"] == {"uid": "req-1", "allowed": True}
    for t in threads:
        t.join(timeout=120)
    for name in ("declared", "streamed"):
        assert results[name] == 413 or "Error" in str(results[name]), results
    with served.client(None) as c:
        padded = json.dumps(review(pod(mem=4))).encode() + b" " * (2 << 20)
        r = c.post(f"{served.url}/admission/validate", content=padded)
    assert r.status_code == 413 and "exceeds the limit of 1048576 bytes (--max-body-bytes)" in r.json()["error"]
