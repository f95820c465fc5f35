"""Connecting to the apiserver: which kubeconfig wins, and clear errors when none works."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from devplugin.kube.client import KubeConfigError, load_api_client
from devplugin_sim.fake_apiserver import FakeApiserver


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver() as fake:
        fake.add_node("gpu-node-1")
        yield fake


def _nodes(api_client: client.ApiClient) -> list[str]:
    return [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items]


def test_explicit_kubeconfig(api: FakeApiserver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")  # the explicit file wins over the env
    assert _nodes(load_api_client(api.kubeconfig_path)) == ["gpu-node-1"]


def test_kubeconfig_env(api: FakeApiserver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", api.kubeconfig_path)
    assert _nodes(load_api_client("")) == ["gpu-node-1"]


def test_home_kubeconfig_when_nothing_else(api: FakeApiserver, monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(Path(api.kubeconfig_path).read_text())
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _nodes(load_api_client()) == ["gpu-node-1"]


def test_missing_explicit_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="nope.yaml.*--kubeconfig"):
        load_api_client(str(tmp_path / "nope.yaml"))


def test_broken_kubeconfig_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(KubeConfigError, match="cannot be used"):
        load_api_client(str(bad))


def test_nothing_configured_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeConfigError, match="in-cluster service account.*--kubeconfig"):
        load_api_client()


def test_a_timed_out_read_is_retried_once_only(api: FakeApiserver) -> None:
    """The loops and the writer retry with their own backoff; the client itself tries a read at most twice."""
    core = client.CoreV1Api(load_api_client(api.kubeconfig_path))
    api.delay(1.0)
    with pytest.raises(Exception):  # noqa: B017 - urllib3's timeout error, wrapped
        core.list_node(_request_timeout=(1.0, 0.2))
    api.delay(0)
    assert len(api.requests_matching("GET", "/api/v1/nodes")) == 2
