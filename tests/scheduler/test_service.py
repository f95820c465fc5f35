"""`devplugin scheduler` as a process: HTTPS from files, readiness once the lists arrive, the extender answering
kube-scheduler's JSON over TLS, a new certificate served after the files change, structured logs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devplugin_sim.fake_apiserver import FakeApiserver
from tests.scheduler.test_cluster import wait_for
from tests.scheduler.tls_certs import make_ca, make_leaf
from tests.support.scheduler_objects import node, pod

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for test certs")


def make_cert(directory: Path, cn: str) -> tuple[Path, Path]:
    cert, key = directory / f"{cn}.crt", directory / f"{cn}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={cn}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_cn(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    text = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-subject"], input=der,
                          capture_output=True, check=True).stdout.decode()
    return text.strip().rsplit("=", 1)[-1].strip()


@pytest.fixture()
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver(bookmark_interval_s=0.2) as fake:
        yield fake


def test_https_service_end_to_end_with_certificate_reload(api: FakeApiserver, tmp_path: Path) -> None:
    n = node("n1", gpus=4, units=15)
    api.add_node("n1", labels=n["metadata"]["labels"], annotations=n["metadata"]["annotations"])
    live = tmp_path / "live"
    live.mkdir()
    first = make_cert(tmp_path, "first")
    shutil.copy(first[0], live / "tls.crt")
    shutil.copy(first[1], live / "tls.key")
    ca = make_ca(tmp_path, "client-ca")
    client_cert = make_leaf(tmp_path, ca, "kube-scheduler", "clientAuth")
    port = free_port()
    log = (tmp_path / "log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "devplugin", "scheduler", "--address", "127.0.0.1", "--port", str(port),
         "--tls-cert-file", str(live / "tls.crt"), "--tls-private-key-file", str(live / "tls.key"),
         "--client-ca-file", str(ca[0]), "--kubeconfig", api.kubeconfig_path, "--log-format", "json"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    url = f"https://127.0.0.1:{port}"
    try:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the served certificate changes mid-test
        ctx.load_cert_chain(str(client_cert[0]), str(client_cert[1]))  # kube-scheduler's client certificate
        with httpx.Client(verify=ctx, timeout=5) as http:
            def ready() -> bool:
                try:
                    return http.get(f"{url}/readyz").status_code == 200
                except httpx.TransportError:
                    assert proc.poll() is None, (tmp_path / "log").read_text()
                    return False

            wait_for(ready, timeout=30, what="readyz")
            r = http.post(f"{url}/scheduler/filter", json={"Pod": pod(mem=20), "NodeNames": ["n1"]})
            assert r.json()["FailedNodes"] == {"n1": "GPU 0..3: at most 15 GiB free on one GPU, 20 GiB asked"}
            assert http.post(f"{url}/scheduler/filter", content=b"{").status_code == 400
            assert served_cn(port) == "first"
            second = make_cert(tmp_path, "second")
            shutil.copy(second[1], live / "tls.key")
            shutil.copy(second[0], live / "tls.crt")
            wait_for(lambda: served_cn(port) == "second", timeout=15, what="the new certificate")
            assert http.get(f"{url}/healthz").text == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    log.seek(0)
    records = [json.loads(line) for line in log.read().splitlines() if line.startswith("{")]
    assert any(r["msg"] == "TLS certificate reloaded" for r in records)
    assert any(r["msg"].startswith("bad request") and r.get("path") == "/scheduler/filter" for r in records)


def test_missing_tls_files_are_refused_at_start() -> None:
    r = subprocess.run([sys.executable, "-m", "devplugin", "scheduler", "--tls-cert-file", "/nonexistent.crt",
                        "--tls-private-key-file", "/nonexistent.key"], capture_output=True, text=True)
    assert r.returncode == 2 and "--tls-cert-file /nonexistent.crt: no such file" in r.stderr


def test_a_missing_kubeconfig_is_refused_at_start_with_what_was_tried() -> None:
    r = subprocess.run([sys.executable, "-m", "devplugin", "scheduler", "--plain-http", "--port", str(free_port()),
                        "--kubeconfig", "/nonexistent/kubeconfig", "--log-format", "text"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "kubeconfig '/nonexistent/kubeconfig' (--kubeconfig) does not exist or is not a file" in r.stderr


def test_long_lived_objects_are_frozen_once_synced_then_every_few_minutes() -> None:
    import gc

    from devplugin.scheduler.service import FREEZE_EVERY_S, freeze_long_lived
    from devplugin.scheduler.state import ClusterState

    state = ClusterState()
    assert freeze_long_lived(state, 0.0, now=100.0) == 0.0  # not synced: nothing frozen yet
    state.replace_nodes([node("n1")])
    state.replace_pods([pod("p", mem=1, node_name="n1")])
    try:
        assert freeze_long_lived(state, 0.0, now=100.0) == 100.0
        assert gc.get_freeze_count() > 0
        assert freeze_long_lived(state, 100.0, now=100.0 + FREEZE_EVERY_S - 1) == 100.0
        assert freeze_long_lived(state, 100.0, now=100.0 + FREEZE_EVERY_S) == 100.0 + FREEZE_EVERY_S
    finally:
        gc.unfreeze()
