"""daemonset.yaml gives the daemon what it calls and where it looks: RBAC, node selection, mounts, probes, env.

The paths and the port are checked against `devplugin serve`'s own defaults, so a default changed in code without
the manifest (or the reverse) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devplugin import contract as c
from devplugin.app.config import Config

MANIFEST = Path(__file__).resolve().parents[1] / "daemonset.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


@pytest.fixture(scope="module")
def pod(docs: dict[str, dict]) -> dict:
    return docs["DaemonSet"]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def daemon(pod: dict) -> dict:
    [container] = [c for c in pod["containers"] if c["name"] == "devplugin"]
    return container


def test_rbac_grants_exactly_what_the_daemon_calls(docs: dict[str, dict]) -> None:
    rules = {(g, r): sorted(rule["verbs"]) for rule in docs["ClusterRole"]["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules == {
        ("", "pods"): ["get", "list", "patch", "watch"],
        ("", "nodes"): ["get", "list", "patch", "watch"],
        ("", "events"): ["create", "patch"],
    }
    binding = docs["ClusterRoleBinding"]
    sa = docs["ServiceAccount"]["metadata"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]} in binding["subjects"]
    assert docs["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]


def test_it_runs_on_every_node_labelled_for_gpu_sharing_whatever_the_mode(pod: dict) -> None:
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exprs = [e for t in terms for e in t["matchExpressions"]]
    assert {"key": c.LABEL_MODE, "operator": "Exists"} in exprs  # core_mem, cgpu and share alike
    for legacy in c.LEGACY_MODE_LABELS:  # older nodes the daemon also serves
        assert {"key": legacy, "operator": "In", "values": ["true"]} in exprs
    assert "nodeSelector" not in pod  # a nodeSelector would AND with the affinity and narrow it
    assert pod["priorityClassName"] == "system-node-critical"
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in pod["tolerations"])


def test_the_host_paths_the_daemon_uses_are_mounted_where_it_looks(pod: dict, daemon: dict) -> None:
    defaults = Config()
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m for m in daemon["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in daemon["env"]}
    wanted = {
        defaults.plugin_dir: False,
        str(Path(defaults.pod_resources_socket).parent): True,
        env.get("DEVPLUGIN_SHIM_STATE_DIR", defaults.shim_state_dir): False,
        env.get("DEVPLUGIN_STATE_DIR", defaults.state_dir): False,
    }
    for path, read_only in wanted.items():
        assert path in mounts, f"{path} is not mounted into the daemon"
        assert mounts[path].get("readOnly", False) == read_only, path
        assert volumes[mounts[path]["name"]]["path"] == path, f"{path} is not the same path on the host"
    for path in (defaults.state_dir, defaults.shim_state_dir):
        assert volumes[mounts[path]["name"]]["type"] == "DirectoryOrCreate"


def test_node_name_comes_from_the_downward_api(daemon: dict) -> None:
    [node] = [e for e in daemon["env"] if e["name"] == Config().env_name("node_name")]
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_probes_ask_the_health_port(daemon: dict) -> None:
    port = {p["name"]: p["containerPort"] for p in daemon["ports"]}["health"]
    env = {e["name"]: e.get("value") for e in daemon["env"]}
    assert port == int(env.get("DEVPLUGIN_HEALTH_PORT", Config().health_port)) == 8089
    assert daemon["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert daemon["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
