"""Connect to the apiserver: an explicit kubeconfig, else $KUBECONFIG, else the in-cluster service account,
else ~/.kube/config."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException
from urllib3.util.retry import Retry


def drain(resp: Any) -> None:
    """Read a raw answer (`_preload_content=False`) to its end and give its connection back to the pool. Left
    unread, the connection is dropped: every write then opens a new TCP and TLS connection (costly on a loaded
    apiserver, which also logs each dropped answer as a broken pipe)."""
    resp.read()
    resp.release_conn()


class KubeConfigError(RuntimeError):
    """No way to reach the apiserver could be configured; the message lists what was tried and what to do."""


def _configuration() -> client.Configuration:
    cfg = client.Configuration()
    # One quick retry (a pooled connection the server closed), no more: the watch loops and the writer retry
    # with their own backoff, and a direct read on the admission path has a budget to keep.
    cfg.retries = Retry(total=1, connect=1, read=1, status=0, redirect=0, backoff_factor=0)
    return cfg


def _from_file(path: str, origin: str) -> client.ApiClient:
    """One file, or several joined by os.pathsep (as $KUBECONFIG allows; missing ones are skipped)."""
    if not any(Path(p).is_file() for p in path.split(os.pathsep) if p):
        raise KubeConfigError(f"kubeconfig {path!r} ({origin}) does not exist or is not a file")
    try:
        return config.new_client_from_config(config_file=path, client_configuration=_configuration())
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        raise KubeConfigError(f"kubeconfig {path!r} ({origin}) cannot be used: {exc}") from None


def load_api_client(kubeconfig: str = "") -> client.ApiClient:
    """An ApiClient for the first source that applies. A source that is named (the argument, $KUBECONFIG) but
    broken is an error; it does not fall through to the next one."""
    if kubeconfig:
        return _from_file(kubeconfig, "--kubeconfig")
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return _from_file(env, "$KUBECONFIG")
    tried = []
    try:
        cfg = _configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except ConfigException as exc:
        tried.append(f"in-cluster service account: {exc}")
    home = Path.home() / ".kube" / "config"
    if home.is_file():
        return _from_file(str(home), "~/.kube/config")
    tried.append(f"{home}: no such file")
    raise KubeConfigError("cannot reach the apiserver: no kubeconfig given and none found (" + "; ".join(tried)
                          + "). Run in a pod with a service account, or pass --kubeconfig / set KUBECONFIG")
