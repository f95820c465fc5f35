"""`kubectl inspect gpushare` shows use beside allocation: the real daemon (fake apiserver, kubelet emulator) and
the real shim over the fake driver in a container's process; inspect reaches the daemon's /metrics through the
apiserver's pod proxy, as it does on a cluster, with a token of gpushare-metrics-reader (the daemon's metrics port
answers no other; the real apiserver's part of it: tests/realk8s/app/test_metrics_auth.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from devplugin import contract
from devplugin.app.metrics_auth import TokenCheck, User
from devplugin.app.metrics_server import metrics_server
from devplugin.inspect.cli import main
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.app.test_metrics_containers import admit, container_env, poll, start, stop, until
from tests.app.test_metrics_containers import r as r  # noqa: F401 - the fixture: daemon with the shim delivered
from tests.support.daemon_harness import Running, _until
from tests.support.shim_probe import GiB

READER = "system:serviceaccount:kube-system:gpushare-metrics-reader"


@pytest.fixture
def daemon_pod(r: Running) -> Iterator[dict]:  # noqa: F811
    """The node daemon's pod as the apiserver lists it: running on the node, its ports named; its metrics port
    answers a token of gpushare-metrics-reader alone, as with --metrics-auth kubernetes (the fake apiserver's
    tokens reviewed in place of TokenReview and SubjectAccessReview)."""
    assert r.api is not None and r.http is not None and r.metrics is not None
    check = TokenCheck(lambda token: User(u) if (u := FakeApiserver.token_user(token)) else None,
                       lambda user: (user.name == READER, "not the reader"))
    metrics = metrics_server("127.0.0.1", 0, r.metrics.exposition, check).start()
    pod = r.api.add_pod({
        "metadata": {"name": "gpushare-devplugin-x1", "namespace": "kube-system",
                     "labels": {"app": "gpushare-devplugin"}},
        "spec": {"nodeName": r.node_name, "containers": [{
            "name": "devplugin", "image": "gpushare/devplugin:0.1.0",
            "ports": [{"name": "health", "containerPort": r.http.port, "protocol": "TCP"},
                      {"name": "metrics", "containerPort": metrics.port, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"}})
    try:
        yield pod
    finally:
        metrics.stop()


def inspect(r: Running, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert r.api is not None
    assert main([*args, "--kubeconfig", r.api.kubeconfig_path]) == 0
    return capsys.readouterr().out


def test_inspect_shows_each_container_s_use_beside_its_allocation(r: Running, daemon_pod: dict,  # noqa: F811
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, busy = admit(r, "busy", mem=4, core=50)
    admit(r, "quiet", mem=2, core=20)
    gpu = busy.envs[contract.ENV_NVIDIA_VISIBLE_DEVICES]  # type: ignore[attr-defined]
    proc = start(container_env(r, busy), "init", "ctx", 0, "alloc", "512m", "fill", "alloc", "512m", "ready")
    try:
        until(proc, "ready")
        poll(r, lambda m: m["gpushare_container_memory_used_bytes"].get(("busy", gpu)) == 4 * GiB,
             "4 GiB used by busy")
        assert r.nd is not None and r.nd.link.writer is not None
        r.nd.link.writer.flush(5)
        index = next(g.index for g in r.nd.node.gpus if g.uuid == gpu)
        row = f"  {index}    6/15         4     70/100   0     2"
        # the daemon's records and its published usage reach the apiserver through its background writer
        assert _until(lambda: row in inspect(r, capsys, "-d", r.node_name), 5), inspect(r, capsys, "-d", r.node_name)
        out = inspect(r, capsys, "-d", r.node_name)
        assert all(len(line) <= 80 for line in out.splitlines()), out
        assert "  GPU  MEMORY(GiB)  USED  CORE(%)  USED  PODS" in out, out
        assert "       default/busy (main)  4 GiB  50 %  allocated  used 4 GiB  0 %  refused 1\n" in out, out
        assert "       default/quiet (main)  2 GiB  20 %  allocated  used 0 GiB  0 %\n" in out, out
        doc = json.loads(inspect(r, capsys, "-o", "json", r.node_name))
        node = doc["nodes"][0]
        assert node["useError"] == ""
        row = next(g for g in node["gpus"] if g["uuid"] == gpu)
        assert row["memUsedMiB"] == 4096 and row["computeUsed"] == 0
        busy_row = next(p for p in row["pods"] if p["name"] == "busy")
        assert (busy_row["memUsedMiB"], busy_row["refused"]) == (4096, 1)
    finally:
        stop(proc)


def test_a_daemon_that_does_not_answer_leaves_use_unknown_with_why(r: Running, daemon_pod: dict,  # noqa: F811
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert r.api is not None
    r.api.patch_pod("kube-system", "gpushare-devplugin-x1", {"status": {"podIP": "127.0.0.2"}})
    r.api.patch_pod("kube-system", "gpushare-devplugin-x1", {"spec": {"containers": [{
        "name": "devplugin", "ports": [{"name": "metrics", "containerPort": 1, "protocol": "TCP"}]}]}})
    out = inspect(r, capsys, r.node_name)
    assert "! use unknown: daemon kube-system/gpushare-devplugin-x1 answered 503" in out, out


def test_a_daemon_that_refuses_the_token_says_why(r: Running, daemon_pod: dict,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert r.api is not None and r.metrics is not None
    nobody = TokenCheck(lambda token: User(u) if (u := FakeApiserver.token_user(token)) else None,
                        lambda user: (False, "no RBAC policy matched"))
    refusing = metrics_server("127.0.0.1", 0, r.metrics.exposition, nobody).start()
    try:
        r.api.patch_pod("kube-system", "gpushare-devplugin-x1", {"spec": {"containers": [{
            "name": "devplugin", "ports": [{"name": "metrics", "containerPort": refusing.port, "protocol": "TCP"}]}]}})
        out = inspect(r, capsys, r.node_name)
    finally:
        refusing.stop()
    assert (f"! use unknown: daemon kube-system/gpushare-devplugin-x1 answered 403 Forbidden: {READER} may not get "
            "/metrics (no RBAC policy matched)") in " ".join(out.split()), out  # the report wraps at 80 columns
