"""Kubeconfig files for the cluster's identities: client certificates (admin, kube-scheduler, each node) and
service-account tokens (the project's scheduler service and node daemon, as their Pods would have them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.realk8s.certs import Pair
from tests.realk8s.manifests import kubectl

TOKEN_DURATION = "48h"


def write(path: Path, server: str, ca: Path | None, user: str, *, cert: Pair | None = None, token: str = "") -> Path:
    """A kubeconfig for `user` at `server` (CA `ca`; None: the server's certificate is not checked, for an
    apiserver's own self-signed one), with a client certificate or a bearer token."""
    creds: dict[str, str] = {"token": token} if token else {}
    if cert is not None:
        creds = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
    tls: dict[str, object] = {"insecure-skip-tls-verify": True} if ca is None else {"certificate-authority": str(ca)}
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "realk8s",
        "clusters": [{"name": "realk8s", "cluster": {"server": server, **tls}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "realk8s", "context": {"cluster": "realk8s", "user": user}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def service_account_token(admin: Path, namespace: str, name: str, pod: tuple[str, str] | None = None) -> str:
    """A token of ServiceAccount namespace/name from the TokenRequest API (`kubectl create token`); bound to the
    Pod (name, uid) when given, as a Pod's projected token is (it then names the Pod's node)."""
    bound = [] if pod is None else ["--bound-object-kind=Pod", f"--bound-object-name={pod[0]}",
                                    f"--bound-object-uid={pod[1]}"]
    proc = subprocess.run([kubectl(), "--kubeconfig", str(admin), "-n", namespace, "create", "token", name,
                           f"--duration={TOKEN_DURATION}", *bound], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl create token {namespace}/{name} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()
