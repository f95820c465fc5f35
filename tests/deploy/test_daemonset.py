"""daemonset.yaml gives the daemon what it calls and where it looks: RBAC, node selection, mounts, probes, env.

The paths and the port are checked against `devplugin serve`'s own defaults, so a default changed in code without
the manifest (or the reverse) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devplugin import contract as c
from devplugin.app.config import Config

MANIFEST = Path(__file__).resolve().parents[2] / "daemonset.yaml"


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


def test_the_daemon_runs_as_its_service_account(docs: dict[str, dict]) -> None:
    # what the ClusterRole grants is checked against the code in tests/deploy/test_rbac.py
    objects = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    name = docs["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"]
    [sa] = [o["metadata"] for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == name]
    [binding] = [o for o in objects if o["kind"] == "ClusterRoleBinding"
                 and {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]} in o["subjects"]]
    assert any(o["kind"] == "ClusterRole" and o["metadata"]["name"] == binding["roleRef"]["name"] for o in objects)


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


def test_shim_library_is_installed_where_allocate_mounts_it_from(pod: dict, daemon: dict) -> None:
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m for m in daemon["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in daemon["env"]}
    lib = Path(env.get("DEVPLUGIN_SHIM_LIB", Config().shim_lib))
    [mount] = [m for path, m in mounts.items() if lib.is_relative_to(path)]
    assert mount["readOnly"] is True
    host_lib = Path(volumes[mount["name"]]) / lib.relative_to(mount["mountPath"])
    assert host_lib == lib  # the daemon names the library by its host path, and the host path is the same
    [install] = pod["initContainers"]
    [target] = [m for m in install["volumeMounts"] if m["name"] == mount["name"]]
    assert f"{target['mountPath']}/{lib.relative_to(mount['mountPath'])}" in " ".join(install["command"])


def test_one_node_at_a_time_and_never_two_daemons_on_a_node(docs: dict[str, dict]) -> None:
    strategy = docs["DaemonSet"]["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}


def test_requests_and_limits_from_the_measured_steady_rss(daemon: dict) -> None:
    # bench/restart_and_health.py: steady RSS 47 to 51 MB (deploy/base/daemonset.yaml says how the figures follow)
    res = daemon["resources"]
    assert res["requests"] == {"cpu": "20m", "memory": "64Mi"}
    assert res["limits"] == {"memory": "256Mi"}  # no CPU limit: throttling delays admissions


def test_the_daemon_has_no_capability_and_a_read_only_root(daemon: dict) -> None:
    sc = daemon["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert daemon["command"] == ["devplugin", "serve"]
