"""The other GPU schedulers the node daemon works with, as the real cluster sees them: their identities and their bind.

- Alibaba's gpushare-scheduler-extender runs as ServiceAccount kube-system/gpushare-schd-extender with the RBAC of
  its deploy YAML (config/gpushare-schd-extender.yaml: patch/update pods, create pods/binding); at bind it writes
  its ALIYUN_COM_GPU_MEM_* annotations on the pending pod, then creates the Binding.
- ACK's scheduler plugins run inside kube-scheduler (user system:kube-scheduler, the harness's kube-scheduler
  certificate); they write scheduler.framework.gpushare.* on the pod before kube-scheduler binds it.

The pods they place carry a `schedulerName` no running scheduler answers to, so only this bind places them. The
project's admission policy lets these users (listed in ConfigMap kube-system/gpushare-annotation-writers) write
these annotations, and no one else but the extender and the node daemon of the pod's node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.realk8s import kubeconfigs

SCHEDULER_NAME = "other-gpu-scheduler"  # no scheduler of the cluster answers to it
ALIBABA_ACCOUNT = ("kube-system", "gpushare-schd-extender")


def _client(kubeconfig: Path) -> k8s.CoreV1Api:
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return k8s.CoreV1Api(k8s.ApiClient(cfg))


def alibaba_extender(admin: k8s.ApiClient, admin_kubeconfig: Path, server: str, ca: Path, out: Path) -> k8s.CoreV1Api:
    """A client with a token of Alibaba's extender's ServiceAccount, created with the RBAC its deploy YAML gives it
    (idempotent: a second call reuses the objects)."""
    ns, name = ALIBABA_ACCOUNT
    rbac = k8s.RbacAuthorizationV1Api(admin)
    for create, body in (
        (lambda b: k8s.CoreV1Api(admin).create_namespaced_service_account(ns, b), {"metadata": {"name": name}}),
        (rbac.create_cluster_role, {"metadata": {"name": name}, "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["update", "patch", "get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["bindings", "pods/binding"], "verbs": ["create"]}]}),
        (rbac.create_cluster_role_binding, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}),
    ):
        try:
            create(body)
        except k8s.ApiException as err:
            if err.status != 409:
                raise
    token = kubeconfigs.service_account_token(admin_kubeconfig, ns, name)
    return _client(kubeconfigs.write(out, server, ca, name, token=token))


def kube_scheduler(admin: k8s.ApiClient, kubeconfig: Path) -> k8s.CoreV1Api:
    """A client as kube-scheduler (its certificate), with the pod patch right ACK's plugins are given."""
    rbac = k8s.RbacAuthorizationV1Api(admin)
    name = "ack-gpushare-scheduler-plugins"
    for create, body in (
        (rbac.create_cluster_role, {"metadata": {"name": name}, "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch", "update"]}]}),
        (rbac.create_cluster_role_binding, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-scheduler"}]}),
    ):
        try:
            create(body)
        except k8s.ApiException as err:
            if err.status != 409:
                raise
    return _client(kubeconfig)


def bind_with_choice(scheduler: k8s.CoreV1Api, ns: str, name: str, node: str, annotations: dict[str, str]) -> None:
    """What those schedulers do at bind: write the choice annotations on the pending pod, then bind it."""
    scheduler.patch_namespaced_pod(name, ns, {"metadata": {"annotations": annotations}})
    binding: dict[str, Any] = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns},
                               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    # the client cannot read the apiserver's Status reply to a Binding as a V1Binding: ask for the raw reply
    scheduler.create_namespaced_pod_binding(name, ns, binding, _preload_content=False)
