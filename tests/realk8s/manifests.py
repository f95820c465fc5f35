"""The project's own manifests (deploy/), rendered by the real kubectl and adapted only where loopback forces it.

Adaptations, each because the components run as local processes on 127.0.0.1 rather than as Pods:
- the webhooks' `clientConfig.service` becomes `clientConfig.url: https://127.0.0.1:PORT/<same path>` with the
  harness's CA as `caBundle` (Endpoints refuse 127.0.0.0/8, so a Service cannot lead to a local process);
- cert-manager's Issuers and Certificates are left out (no cert-manager runs): the harness makes the serving
  certificate itself (SANs: the Service's DNS names and 127.0.0.1);
- the kube-scheduler configuration (`deploy/scheduler/kube-scheduler-config.yaml`) gets the harness's kubeconfig,
  the extender's loopback URL, the CA file and kube-scheduler's client certificate, and no leader election (one
  kube-scheduler, no other candidate);
- `devplugin scheduler` runs with the Deployment's own arguments (leader election on its Lease, mutual TLS for
  the extender's verbs), the file paths and port replaced by the harness's, one replica.
- with no controller-manager, the DaemonSet creates no Pods: the harness creates each node's daemon Pod from the
  DaemonSet's template (bound to the node) so that the daemon's ServiceAccount token can be bound to it and name
  its node, as the shipped admission policies require; the Deployment creates no Pods either.
Everything else (RBAC, ServiceAccounts, admission policies, the DaemonSet, the Deployment, the Services) is
applied as shipped, and the harness runs the programs as processes with the same identities.
"""

from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
OVERLAY = REPO / "deploy" / "overlays" / "with-scheduler"
SCHEDULER_CONFIG = REPO / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
CERT_MANAGER_GROUP = "cert-manager.io/"


def kubectl() -> str:
    venv = REPO / ".venv" / "bin" / "kubectl"
    return str(venv) if venv.exists() else "kubectl"


def render(overlay: Path = OVERLAY) -> list[dict[str, Any]]:
    """`kubectl kustomize <overlay>` as a list of objects."""
    out = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def adapt(objects: list[dict[str, Any]], extender_base: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The objects with the loopback adaptations above (copies; the input is left alone)."""
    out = []
    ca_bundle = base64.b64encode(ca_pem).decode()
    for obj in objects:
        if obj.get("apiVersion", "").startswith(CERT_MANAGER_GROUP):
            continue
        obj = copy.deepcopy(obj)
        if obj["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for hook in obj["webhooks"]:
                service = hook["clientConfig"].pop("service")
                hook["clientConfig"] = {"url": extender_base + service["path"], "caBundle": ca_bundle}
        out.append(obj)
    return out


def scheduler_service_args(objects: list[dict[str, Any]]) -> list[str]:
    """The shipped Deployment's `devplugin scheduler` arguments (its container's command after the program, then
    its args), to run the service as a process with the same settings."""
    [deploy] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "devplugin-scheduler"]
    [ctr] = deploy["spec"]["template"]["spec"]["containers"]
    return list(ctr.get("command", [])[1:]) + list(ctr.get("args", []))


def daemonset_pod(objects: list[dict[str, Any]], node: str) -> dict[str, Any]:
    """The node daemon's Pod on `node` as the DaemonSet controller would create it from the shipped template (its
    ServiceAccount token is bound to this Pod, so the token names the node)."""
    [ds] = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpushare-devplugin"]
    template = copy.deepcopy(ds["spec"]["template"])
    spec = template["spec"]
    spec.pop("affinity", None)
    spec["nodeName"] = node
    meta = {**template.get("metadata", {}), "name": f"{ds['metadata']['name']}-{node}",
            "namespace": ds["metadata"]["namespace"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def with_flags(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` with each `--flag=value` (or `--flag value`) named in `values` set to the new value; flags not there
    are added."""
    out, seen, i = [], set(), 0
    while i < len(args):
        arg = args[i]
        name, eq, _ = arg.partition("=")
        if name in values:
            seen.add(name)
            out.append(f"{name}={values[name]}")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
        else:
            out.append(arg)
        i += 1
    out += [f"{k}={v}" for k, v in values.items() if k not in seen]
    return out


def apply(objects: list[dict[str, Any]], kubeconfig: Path) -> str:
    """`kubectl apply -f -` with the objects; kubectl's output (raises with its stderr on failure)."""
    proc = subprocess.run([kubectl(), "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
                          input=yaml.safe_dump_all(objects), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl apply of the project's manifests failed:\n{proc.stderr}")
    return proc.stdout


def scheduler_config(kubeconfig: Path, extender_base: str | None, ca_file: Path,
                     client: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """The shipped KubeSchedulerConfiguration, pointed at this cluster (the extender's URL on loopback, the CA and
    kube-scheduler's client certificate for it); extender_base None: no extender (the plain kube-scheduler, for
    comparison)."""
    cfg = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    cfg["clientConnection"]["kubeconfig"] = str(kubeconfig)
    cfg["leaderElection"] = {"leaderElect": False}
    if extender_base is None:
        cfg.pop("extenders", None)
        return cfg
    for ext in cfg["extenders"]:
        ext["urlPrefix"] = extender_base + "/scheduler"
        ext["tlsConfig"]["caFile"] = str(ca_file)
        if client is not None and "certFile" in ext["tlsConfig"]:
            ext["tlsConfig"]["certFile"], ext["tlsConfig"]["keyFile"] = str(client[0]), str(client[1])
    return cfg
