"""The apiserver client of a command a person runs against a cluster (`devplugin inspect`, `devplugin dra-limits`):
its `--kubeconfig` flag, and the client that flag names, or why there is none said on stderr in the command's name."""

from __future__ import annotations

import argparse
import sys

from kubernetes import client

from devplugin.kube.client import KubeConfigError, load_api_client

KUBECONFIG_HELP = "kubeconfig (default: $KUBECONFIG, then the in-cluster service account, then ~/.kube/config)"
NAME_ONE = "; set KUBECONFIG or --kubeconfig"  # the hint when no kubeconfig was named


def add_kubeconfig_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default="", help=KUBECONFIG_HELP)


def command_client(kubeconfig: str, command: str, hint: bool = False) -> client.ApiClient | None:
    """The client for `kubeconfig` (load_api_client's sources), or None once `command: cannot load a kubeconfig:
    <why>` is on stderr; with `hint`, and no kubeconfig named, the line ends saying how to name one."""
    try:
        return load_api_client(kubeconfig)
    except KubeConfigError as exc:
        tail = NAME_ONE if hint and not kubeconfig else ""
        sys.stderr.write(f"{command}: cannot load a kubeconfig: {exc}{tail}\n")
        return None
