"""deploy/components/dra-node: the DaemonSet of `devplugin dra` (its env names real flags, it runs on DRA-labelled
nodes with the kubelet's plugin directories), its RBAC (what the plugin calls, nothing more), and on the real
kube-apiserver the policy that keeps each node's plugin to its own node's ResourceSlices, exercised with the
plugin's own publisher and a pod-bound token as the DaemonSet mounts it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from dataclasses import fields
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from devplugin import contract
from devplugin.app.dra_config import DraConfig
from devplugin.dra.publisher import SlicePublisher
from devplugin.dra.slices import build_slices
from devplugin.gpu.facts import GpuFacts
from devplugin.kube.client import load_api_client
from tests.dra.objects import GPUS
from tests.realk8s import kubeconfigs
from tests.realk8s.apiserver import bare_apiserver
from tests.support.deploy_render import DEPLOY, render_text

COMPONENT = DEPLOY / "components" / "dra-node"
KUBECTL = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kubectl"


def render(tmp_path: Path) -> list[dict]:
    mine = tmp_path / "overlay"
    mine.mkdir()
    rel = os.path.relpath(DEPLOY, mine)
    (mine / "kustomization.yaml").write_text(textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources: [{rel}/overlays/node-only]
        components: [{rel}/components/dra, {rel}/components/dra-node]
    """))
    return [d for d in yaml.safe_load_all(render_text(mine)) if d]


def test_the_daemonset_runs_the_plugin_on_dra_nodes_with_real_flags(tmp_path: Path) -> None:
    objects = render(tmp_path)
    mine = [o for o in objects if "gpushare-dra-plugin" in o["metadata"]["name"]]
    assert {(o["kind"], o["metadata"]["name"]) for o in mine} == {
        ("ServiceAccount", "gpushare-dra-plugin"), ("ClusterRole", "gpushare-dra-plugin"),
        ("ClusterRoleBinding", "gpushare-dra-plugin"), ("DaemonSet", "gpushare-dra-plugin"),
        ("ValidatingAdmissionPolicy", "gpushare-dra-plugin-own-slices"),
        ("ValidatingAdmissionPolicyBinding", "gpushare-dra-plugin-own-slices"),
        ("NetworkPolicy", "gpushare-dra-plugin")}
    for obj in mine:
        for version in ("1.34.0", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(obj, version, strict=True)
    ds = next(o for o in mine if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {contract.LABEL_ALLOCATION: contract.ALLOCATION_DRA}
    (container,) = pod["containers"]
    assert container["command"] == ["devplugin", "dra"]
    cfg = DraConfig()
    known = {cfg.env_name(f.name): f.name for f in fields(DraConfig)}
    for env in container["env"]:
        if env["name"].startswith("DEVPLUGIN_DRA_") or env["name"] == "NODE_NAME":
            assert env["name"] in known, f"{env['name']} is not a flag of devplugin dra"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {cfg.plugins_registry_dir, cfg.plugin_dir, cfg.cdi_dir, cfg.shim_state_dir, cfg.state_dir} <= mounts
    port = next(e["value"] for e in container["env"] if e["name"] == "DEVPLUGIN_DRA_HEALTH_PORT")
    assert container["ports"][0]["containerPort"] == int(port)
    token = next(v for v in pod["volumes"] if v["name"] == "api-token")
    assert "serviceAccountToken" in token["projected"]["sources"][0], "pod-bound: the slice policy needs the node"


def test_the_rbac_is_what_the_plugin_calls() -> None:
    role = next(d for d in yaml.safe_load_all((COMPONENT / "rbac.yaml").read_text()) if d["kind"] == "ClusterRole")
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in role["rules"]}
    assert rules == {("resource.k8s.io", "resourceslices"): {"get", "list", "create", "update", "delete"},
                     ("resource.k8s.io", "resourceclaims"): {"get"}, ("", "pods"): {"get", "list", "watch"},
                     ("", "nodes"): {"list", "watch"},
                     ("authentication.k8s.io", "tokenreviews"): {"create"},
                     ("authorization.k8s.io", "subjectaccessreviews"): {"create"}}


def kubectl(kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.realk8s
def test_each_nodes_plugin_writes_only_its_own_nodes_slices() -> None:
    root = Path(tempfile.mkdtemp(prefix="gs-drap-", dir="/tmp"))
    try:
        with bare_apiserver(root, "admintoken") as api:
            kc = api.kubeconfig
            kubectl(kc, "apply", "-f", str(COMPONENT / "rbac.yaml"), "-f", str(COMPONENT / "slice-policy.yaml"))
            for node in ("node-a", "node-b"):
                subprocess.run([str(KUBECTL), "--kubeconfig", str(kc), "create", "-f", "-"], check=True,
                               input=yaml.safe_dump({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
                               text=True, capture_output=True)

            def publisher(node: str, bound_to: str) -> SlicePublisher:
                bound = ["--bound-object-kind", "Node", "--bound-object-name", bound_to] if bound_to else []
                token = kubectl(kc, "-n", "kube-system", "create", "token", "gpushare-dra-plugin", *bound).strip()
                path = kubeconfigs.write(root / f"kc-{node}-{bound_to}", api.server, None, "plugin", token=token)
                return SlicePublisher(load_api_client(str(path)), node,
                                      lambda gen: build_slices(node, GPUS, GpuFacts({}, ""), {}, gen))

            other = publisher("node-b", "node-a")  # node-a's plugin publishing node-b's GPUs
            deadline = time.monotonic() + 60
            while other.sync():  # the policy takes effect once the apiserver has compiled it
                kubectl(kc, "delete", "resourceslice", "node-b-gpushare-counters", "node-b-gpushare-devices")
                other = publisher("node-b", "node-a")
                assert time.monotonic() < deadline, "the slice policy never took effect"
                time.sleep(0.5)
            assert "the gpushare DRA plugin of node node-a may write only ResourceSlices with spec.nodeName node-a" \
                in other.last_error
            # the policy may have taken effect between the two slices of the last try: the admin removes the first
            kubectl(kc, "delete", "resourceslice", "node-b-gpushare-counters", "node-b-gpushare-devices",
                    "--ignore-not-found")
            own = publisher("node-a", "node-a")
            assert own.sync(), own.last_error
            assert kubectl(kc, "get", "resourceslice", "-o", "name").split() == [
                "resourceslice.resource.k8s.io/node-a-gpushare-counters",
                "resourceslice.resource.k8s.io/node-a-gpushare-devices"]
            unbound = publisher("node-a", "")
            assert not unbound.sync() and "must use a pod-bound ServiceAccount token" in unbound.last_error
            # node-b's plugin cannot delete node-a's slices either
            publisher("node-a", "node-b").delete()
            assert len(kubectl(kc, "get", "resourceslice", "-o", "name").split()) == 2
    finally:
        shutil.rmtree(root, ignore_errors=True)
