"""The product as the shipped manifests run it: the node daemon's DaemonSet and the extender's Deployment as pods of
the test cluster, from the product's own image (product_image.py), as their controllers would create them (the
controllers do not run here), with only what several nodes on one machine force adapted:

- the DaemonSet's hostPath volumes name the host's kubelet and project directories (/var/lib/kubelet/...,
  /var/run/gpushare, ...); each node of this machine has its own directory instead, so each hostPath becomes the
  node's own. Where the daemon hands a path of its own to the kubelet as a host path (the shim library, the shim's
  per-container files: the AllocateResponse's mounts), the volume is mounted inside at that node path too, and the
  env that names it follows;
- the extender's Deployment selects the control-plane node: the first node is labelled as one (the control plane's
  processes run on this machine);
- its TLS Secret (cert-manager's Certificate in the shipped manifests) is made from the harness's own PKI.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

from tests.realk8s import manifests

# The DaemonSet's hostPath -> the node's own directory under its root.
NODE_DIRS = {
    "/var/lib/kubelet/device-plugins": "device-plugins",
    "/var/lib/kubelet/pod-resources": "pod-resources",
    "/var/run/gpushare": "shim",
    "/var/lib/gpushare": "state",
    "/usr/local/gpushare": "shim-install",
    "/etc/nvidia-container-runtime": "nvidia-container-runtime",
}
# Paths the daemon also names to the kubelet as host paths: mounted at the node's path inside the container too.
SAME_INSIDE = ("/var/run/gpushare", "/usr/local/gpushare")
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


def daemon_pod(objects: list[dict[str, Any]], node: str, node_root: Path) -> dict[str, Any]:
    """The node daemon's pod on `node` (the DaemonSet's template, as its controller would create it), its host
    directories the node's own."""
    pod = manifests.daemonset_pod(objects, node)
    spec = pod["spec"]
    moved: dict[str, str] = {}  # volume name -> the node path it is mounted at inside too
    for vol in spec.get("volumes", []):
        host = vol.get("hostPath")
        if host is None or host["path"] not in NODE_DIRS:
            continue
        new = str(node_root / NODE_DIRS[host["path"]])
        Path(new).mkdir(parents=True, exist_ok=True)
        if host["path"] in SAME_INSIDE:
            moved[vol["name"]] = new
        host["path"] = new
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        for m in c.get("volumeMounts", []):
            if m["name"] in moved and c["name"] != "install-shim":
                old, m["mountPath"] = m["mountPath"], moved[m["name"]]
                for e in c.get("env", []):
                    if str(e.get("value", "")).startswith(old):
                        e["value"] = moved[m["name"]] + e["value"][len(old):]
    return pod


def extender_pod(objects: list[dict[str, Any]], node: str, index: int = 0) -> dict[str, Any]:
    """One replica of the extender's Deployment, as its ReplicaSet would create it, bound to `node`."""
    [dep] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "devplugin-scheduler"]
    template = copy.deepcopy(dep["spec"]["template"])
    template["spec"]["nodeName"] = node
    meta = {**template.get("metadata", {}), "name": f"{dep['metadata']['name']}-{index}",
            "namespace": dep["metadata"]["namespace"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def tls_secret(objects: list[dict[str, Any]], cert: Path, key: Path, ca: Path) -> dict[str, Any]:
    """The Secret the extender's pod mounts (cert-manager's Certificate would make it): tls.crt, tls.key, ca.crt."""
    [dep] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "devplugin-scheduler"]
    [name] = [v["secret"]["secretName"] for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    data = {"tls.crt": cert.read_bytes(), "tls.key": key.read_bytes(), "ca.crt": ca.read_bytes()}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": dep["metadata"]["namespace"]},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
