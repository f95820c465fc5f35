"""etcd and kube-apiserver as local processes: the flags every apiserver of the tests shares (tests/realk8s/cluster.py
adds its PKI and Node authorization), and a bare apiserver (RBAC on, the admin a static token, its own self-signed
serving certificate) for tests that need the apiserver alone."""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.realk8s import kubeconfigs
from tests.realk8s.binaries import binary
from tests.realk8s.certs import Pair, service_account_keys
from tests.realk8s.processes import Proc, free_port


def start_etcd(etcd: Path, data_dir: Path, log: Path) -> tuple[Proc, str]:
    """A single-member etcd (`etcd` the binary) on loopback, started and ready; (its process, its client URL)."""
    url = f"http://127.0.0.1:{free_port()}"
    proc = Proc("etcd", [str(etcd), "--data-dir", str(data_dir), "--listen-client-url", url,
                         "--listen-peer-url", f"http://127.0.0.1:{free_port()}"], log)
    try:
        proc.start().wait_for_line(r"etcd ready on", timeout=30)
    except BaseException:
        proc.stop()
        raise
    return proc, url


def apiserver_flags(etcd_url: str, port: int, sa: Pair) -> list[str]:
    """kube-apiserver's flags for one apiserver on 127.0.0.1:`port` over `etcd_url`, signing service-account tokens
    with `sa` (no endpoints reconciler: no Service network exists)."""
    return [f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa.cert}", f"--service-account-signing-key-file={sa.key}",
            "--service-cluster-ip-range=10.0.0.0/24", "--profiling=false"]


@dataclass(frozen=True)
class BareApiserver:
    """A running bare apiserver: its URL, the admin's token and a kubeconfig holding it."""

    server: str  # https://127.0.0.1:PORT
    token: str
    kubeconfig: Path
    apiserver: Proc


def _ready(server: str, token: str) -> bool:
    ctx = ssl._create_unverified_context()  # the apiserver's own self-signed certificate
    req = urllib.request.Request(server + "/readyz", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=3) as resp:
        return bool(resp.status == 200)


@contextmanager
def bare_apiserver(root: Path, token: str, timeout: float = 120) -> Iterator[BareApiserver]:
    """etcd and kube-apiserver (e2e/bin) under `root` (logs in root/logs), the user `admin`
    (group system:masters) authenticated by `token`; yields once /readyz answers 200, stops both at the end."""
    sa = service_account_keys(root)
    (root / "tokens.csv").write_text(f"{token},admin,1,system:masters\n")
    etcd, etcd_url = start_etcd(binary("etcd"), root / "etcd", root / "logs" / "etcd.log")
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    api = Proc("kube-apiserver", [str(binary("kube-apiserver")), *apiserver_flags(etcd_url, port, sa),
                                  f"--cert-dir={root / 'certs'}", f"--token-auth-file={root / 'tokens.csv'}",
                                  "--authorization-mode=RBAC"], root / "logs" / "kube-apiserver.log")
    try:
        api.start().wait_until(lambda: _ready(server, token), "ready (/readyz)", timeout)
        kubeconfig = kubeconfigs.write(root / "kubeconfig", server, None, "admin", token=token)
        yield BareApiserver(server, token, kubeconfig, api)
    finally:
        api.stop()
        etcd.stop()
