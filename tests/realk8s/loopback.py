"""What both loopback clusters of the realk8s tests are made of alike (cluster.py: the device plugin's, with the
extender; dra_cluster.py: DRA's): where their binaries are, kube-apiserver with the cluster's PKI and the admin's
client, the not-ready taint no controller removes, a fresh namespace and the deletion of its pods, the components'
logs, and a cluster's life in a temporary directory with the bodies of the pytest fixtures over it."""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.realk8s import kubeconfigs
from tests.realk8s.apiserver import apiserver_flags
from tests.realk8s.binaries import E2E_BIN
from tests.realk8s.certs import Pair, Pki
from tests.realk8s.processes import Proc, free_port

REPO = Path(__file__).resolve().parents[2]
SHIM_LIB = REPO / "build" / "shim" / "libgpushare.so"  # `make native`
BIN = Path(os.environ.get("REALK8S_BIN", str(E2E_BIN)))  # REALK8S_BIN: binaries built elsewhere
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
KEEP_ENV = "REALK8S_KEEP"  # set: leave the cluster's directory (logs, certificates, etcd) in /tmp


def missing_binaries(names: Iterable[str]) -> list[str]:
    return [b for b in names if not (BIN / b).exists()]


def https_get(url: str, ca: Path | None, client: Pair | None = None, timeout: float = 3.0) -> tuple[int, bytes]:
    """GET over TLS checked against `ca` (None: a component's self-signed serving certificate, not checked)."""
    if ca is None:
        ctx = ssl._create_unverified_context()
    else:
        ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
        return resp.status, resp.read()


def healthy(port: int) -> bool:
    """A control-plane component on 127.0.0.1:`port` answers /healthz."""
    return https_get(f"https://127.0.0.1:{port}/healthz", None)[0] == 200


# --- kube-apiserver ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Apiserver:
    """kube-apiserver on 127.0.0.1:`port` with the cluster's PKI, and the admin's identity on it."""

    port: int
    server: str  # https://127.0.0.1:PORT
    admin: Path  # the admin's kubeconfig (system:masters)
    admin_cert: Pair
    ca: Path
    cmd: list[str]

    def ready(self) -> bool:
        return https_get(self.server + "/readyz", self.ca, self.admin_cert)[0] == 200


def apiserver(pki: Pki, sa: Pair, etcd_url: str, cert_dir: Path, admission_plugins: Sequence[str]) -> Apiserver:
    """kube-apiserver's serving certificate, the admin's certificate and kubeconfig, and its command: Node and RBAC
    authorization, the default admission plugins plus `admission_plugins`."""
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    serving = pki.issue("apiserver", "kube-apiserver", server=True, ips=("127.0.0.1", "10.0.0.1"),
                        dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"))
    admin_cert = pki.issue("admin", "realk8s-admin", orgs=("system:masters",))
    admin = kubeconfigs.write(pki.dir / "admin.kubeconfig", server, pki.ca.cert, "admin", cert=admin_cert)
    cmd = [str(BIN / "kube-apiserver"), *apiserver_flags(etcd_url, port, sa), f"--tls-cert-file={serving.cert}",
           f"--tls-private-key-file={serving.key}", f"--client-ca-file={pki.ca.cert}", f"--cert-dir={cert_dir}",
           "--authorization-mode=Node,RBAC",
           f"--enable-admission-plugins={','.join(admission_plugins)}" if admission_plugins else "", "--v=1"]
    return Apiserver(port, server, admin, admin_cert, pki.ca.cert, [a for a in cmd if a])


def admin_client(admin: Path, pool: int | None = None) -> k8s.ApiClient:
    """A client of the admin's kubeconfig, with a connection pool of its own (of `pool` connections when given)."""
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(admin), client_configuration=cfg)
    if pool is not None:
        cfg.connection_pool_maxsize = pool
    return k8s.ApiClient(cfg)


# --- nodes and namespaces ----------------------------------------------------------------------------------------
def ready_and_untainted(core: k8s.CoreV1Api, node: k8s.V1Node) -> bool:
    """Whether the Node is Ready and carries no not-ready taint. A Ready Node's taint is removed here, as the node
    lifecycle controller would (no controller-manager runs it), and shows gone at the next look."""
    ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    tainted = any(t.key == NOT_READY_TAINT for t in (node.spec.taints or []))
    if ready and tainted:
        kept = [core.api_client.sanitize_for_serialization(t) for t in node.spec.taints if t.key != NOT_READY_TAINT]
        core.patch_node(node.metadata.name, {"spec": {"taints": kept}})
    return ready and not tainted


def new_namespace(core: k8s.CoreV1Api, prefix: str) -> str:
    """A fresh namespace with its default ServiceAccount (the service-account controller's job)."""
    name = f"{prefix}-{os.urandom(3).hex()}"
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    return name


def delete_pods(core: k8s.CoreV1Api, ns: str) -> set[str]:
    """Delete the namespace's pods at once (no grace period); the UIDs they had."""
    uids = {p.metadata.uid for p in core.list_namespaced_pod(ns).items}
    for pod in core.list_namespaced_pod(ns).items:
        try:
            core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
    return uids


def component_logs(procs: dict[str, Proc], agents: Iterable[tuple[str, Any]], lines: int) -> list[str]:
    """The last `lines` of each process's log, then of each (node name, node agent)'s."""
    parts = [f"===== {name} ({p.log}) =====\n{p.tail(lines)}" for name, p in procs.items()]
    return parts + [f"===== {name}-agent ({agent.log_path}) =====\n{agent.tail(lines)}" for name, agent in agents]


# --- a cluster's life and the fixtures over it ---------------------------------------------------------------------
class Harness(Protocol):
    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def namespace(self, prefix: str) -> str: ...

    def clear_namespace(self, ns: str, timeout: float) -> None: ...

    def logs(self, lines: int) -> str: ...


C = TypeVar("C", bound=Harness)


@contextmanager
def running_in_tmp(prefix: str, make: Callable[[Path], C]) -> Iterator[C]:
    """The cluster `make(root)` over a fresh directory of /tmp, started, then stopped (every process group) and
    the directory removed at the end (kept with REALK8S_KEEP set)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # unix sockets need short paths
    cluster = make(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if not os.environ.get(KEEP_ENV):
            shutil.rmtree(root, ignore_errors=True)


def namespace_for_test(cluster: Harness, request: pytest.FixtureRequest, prefix: str = "t", lines: int = 40,
                       timeout: float = 60) -> Iterator[str]:
    """The body of a namespace fixture for `cluster`: a fresh namespace, the components' last `lines` of logs
    printed when the test failed, its pods deleted (within `timeout`) at the end."""
    failed = request.session.testsfailed
    name = cluster.namespace(prefix)
    yield name
    if request.session.testsfailed > failed:
        print(cluster.logs(lines))
    cluster.clear_namespace(name, timeout=timeout)
