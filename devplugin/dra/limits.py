"""`devplugin dra-limits [--write]`: the largest GPU memory the driver's ResourceSlices publish, beside the figure
the claim policies check claims against (ConfigMap kube-system/gpushare-dra-limits, key largestGpuMemory:
deploy/components/dra/claim-policies.yaml); `--write` sets the ConfigMap to it. A policy cannot read
ResourceSlices, so this is how the figure is kept: by the operator, after GPU nodes join or leave, or on a
schedule."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from devplugin.inspect.dra_report import build_dra_report, is_quantity, quantity_int
from devplugin.kube.command_client import add_kubeconfig_argument, command_client

KEY = "largestGpuMemory"
MiB, GiB = 1 << 20, 1 << 30


def as_quantity(n: int) -> str:
    """Bytes as the shortest exact quantity: 85899345920 -> "80Gi", 16911433728 -> "16128Mi"."""
    if n and n % GiB == 0:
        return f"{n // GiB}Gi"
    if n and n % MiB == 0:
        return f"{n // MiB}Mi"
    return str(n)


def largest(slices: list[dict]) -> int:
    """The most memory any one device of the driver offers, in bytes (0: no slice)."""
    return build_dra_report(slices, []).largestGpuMemory


def status_lines(largest_bytes: int, current: str | None, namespace: str, name: str) -> list[str]:
    """What the command prints: the slices' figure, the ConfigMap's, and whether claims a GPU could hold are
    refused (limit too low) or impossible ones let through (limit unset or too high)."""
    lines = [f"largest GPU memory the ResourceSlices publish: {as_quantity(largest_bytes)}"]
    where = f"ConfigMap {namespace}/{name} {KEY}"
    if current is None:
        lines.append(f"{where}: no such ConfigMap (claims' memory is not checked against a maximum)")
    elif not current:
        lines.append(f"{where}: empty (claims' memory is not checked against a maximum)")
    else:
        limit = quantity_int(current) if is_quantity(current) else -1
        verdict = ("not a quantity: every claim of the gpushare DeviceClasses is refused" if limit < 0 else
                   "below a GPU: claims it could hold are refused" if limit < largest_bytes else
                   "above every GPU: claims no GPU can hold still pass" if limit > largest_bytes else "current")
        lines.append(f"{where}: {current} ({verdict})")
    return lines


def read_configmap(core: Any, namespace: str, name: str) -> dict | None:
    from kubernetes.client.rest import ApiException

    try:
        return dict(json.loads(core.read_namespaced_config_map(name, namespace, _preload_content=False).data))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def write_limit(core: Any, namespace: str, name: str, value: str, exists: bool) -> None:
    """Set the ConfigMap's key to `value` (patch, or create the ConfigMap when it is missing)."""
    if exists:
        core.patch_namespaced_config_map(name, namespace, {"data": {KEY: value}})
    else:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "namespace": namespace},
                                                      "data": {KEY: value}})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write", action="store_true", help="set the ConfigMap's largestGpuMemory to the slices' figure")
    p.add_argument("--namespace", default="kube-system", help="the ConfigMap's namespace (the Helm release's)")
    p.add_argument("--configmap", default="gpushare-dra-limits", help="the ConfigMap's name")
    add_kubeconfig_argument(p)


def run(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from devplugin.inspect.dra_read import read_dra

    api = command_client(args.kubeconfig, "dra-limits")
    if api is None:
        return 1
    core: Any = client.CoreV1Api(api)
    try:
        objects = read_dra(api)
        cm = read_configmap(core, args.namespace, args.configmap)
    except ApiException as exc:
        sys.stderr.write(f"dra-limits: the apiserver answered {exc.status}: {exc.reason}\n")
        return 1
    except Exception as exc:  # connection refused, timeouts
        sys.stderr.write(f"dra-limits: cannot reach the apiserver: {exc}\n")
        return 1
    if not objects.available:
        sys.stderr.write("dra-limits: this apiserver serves no resource.k8s.io/v1 (Kubernetes 1.34 or later)\n")
        return 1
    top = largest(objects.slices)
    current = None if cm is None else str((cm.get("data") or {}).get(KEY, "")).strip()
    sys.stdout.write("\n".join(status_lines(top, current, args.namespace, args.configmap)) + "\n")
    if not args.write:
        return 0
    if top == 0:
        sys.stderr.write("dra-limits: no ResourceSlice of gpu.gpushare.io publishes a GPU: nothing written "
                         "(is `devplugin dra` running on the DRA nodes?)\n")
        return 1
    try:
        write_limit(core, args.namespace, args.configmap, as_quantity(top), cm is not None)
    except ApiException as exc:
        sys.stderr.write(f"dra-limits: writing ConfigMap {args.namespace}/{args.configmap}: the apiserver "
                         f"answered {exc.status}: {exc.reason}\n")
        return 1
    sys.stdout.write(f"ConfigMap {args.namespace}/{args.configmap} {KEY} set to {as_quantity(top)}\n")
    return 0
