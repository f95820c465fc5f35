"""The image and the manifests agree: every container of the image runs a real `devplugin` command under the
image's ENTRYPOINT / CMD rules, the node daemon keeps root while a non-root container says which user, and the
DaemonSet's shim install puts the image's library where the daemon mounts it from."""

from __future__ import annotations

import shlex
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devplugin.app.config import Config
from devplugin.app.dra_config import DraConfig
from tests.support.dockerfile_parse import Stage, copy_sources, parse

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("serve", "dra", "scheduler", "inspect")


def runtime_stage() -> Stage:
    return parse(REPO / "Dockerfile")[-1]


def image_shim_path() -> str:
    for instruction in runtime_stage().all("COPY"):
        sources, dest, _ = copy_sources(instruction)
        if sources[0].endswith("libgpushare.so"):
            return dest
    raise AssertionError("the image ships no libgpushare.so")


def manifests() -> list[tuple[str, dict]]:
    """Every object of deploy/ and daemonset.yaml, and the Helm chart's objects as it renders them with everything
    on (its templates are not YAML until rendered)."""
    from tests.deploy.test_helm_chart import CHART, render

    files = [REPO / "daemonset.yaml", *sorted((REPO / "deploy").rglob("*.yaml"))]
    found = [(str(f.relative_to(REPO)), doc) for f in files if f.name != "kustomization.yaml"
             and CHART not in f.parents for doc in yaml.safe_load_all(f.read_text()) if isinstance(doc, dict)]
    chart = render("scheduler.enabled=true", "secondScheduler.enabled=true", "monitoring.podMonitor.enabled=true")
    return found + [(f"{CHART.relative_to(REPO)} (rendered)", doc) for doc in chart]


def pod_specs(node: object) -> Iterator[dict]:
    if isinstance(node, dict):
        if "containers" in node and isinstance(node["containers"], list):
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_specs(value)


def image_containers() -> list[tuple[str, dict, dict]]:
    """(where, pod spec, container) for each container, init containers included, that runs this image."""
    found = []
    for where, doc in manifests():
        for spec in pod_specs(doc):
            for container in spec.get("initContainers", []) + spec["containers"]:
                if "devplugin" in container.get("image", "").rsplit(":", 1)[0]:
                    found.append((f"{where}: {doc['kind']} {doc['metadata']['name']}/{container['name']}", spec,
                                  container))
    return found


def argv(container: dict) -> list[str]:
    """What the container runs: Kubernetes' `command` replaces ENTRYPOINT (and drops CMD), `args` replaces CMD."""
    stage = runtime_stage()
    if "command" in container:
        return container["command"] + container.get("args", [])
    return stage.one("ENTRYPOINT").words() + container.get("args", stage.one("CMD").words())


def security(spec: dict, container: dict, key: str) -> object:
    return container.get("securityContext", {}).get(key, spec.get("securityContext", {}).get(key))


def test_manifests_run_the_image() -> None:
    assert any(argv(c)[:2] == ["devplugin", "serve"] for _, _, c in image_containers()), "no node daemon"


@pytest.mark.parametrize("where,spec,container", image_containers(), ids=lambda v: v if isinstance(v, str) else "")
def test_each_container_of_the_image_runs_a_real_command(where: str, spec: dict, container: dict) -> None:
    run = argv(container)
    if run[0] in ("sh", "/bin/sh"):
        assert run[1] == "-c" and image_shim_path() in run[2], f"{where}: a script that installs the shim only"
        return
    assert run[0] == "devplugin" and run[1] in COMMANDS, f"{where}: runs {shlex.join(run)}"


@pytest.mark.parametrize("where,spec,container", image_containers(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_image_user_suits_each_container(where: str, spec: dict, container: dict) -> None:
    run = argv(container)
    user = security(spec, container, "runAsUser")
    if run[:2] in (["devplugin", "serve"], ["devplugin", "dra"]) or run[0] in ("sh", "/bin/sh"):
        # The kubelet's sockets and the shim's host paths are root's: these run as the image's default, root.
        assert user in (None, 0) and not security(spec, container, "runAsNonRoot"), f"{where}: needs root"
    elif security(spec, container, "runAsNonRoot"):
        # The image's default user is root: runAsNonRoot alone makes the kubelet refuse to start the container.
        assert isinstance(user, int) and user > 0, f"{where}: runAsNonRoot needs runAsUser (the image has 65532)"


def test_the_shim_install_puts_the_image_library_where_the_daemon_mounts_it(tmp_path: Path) -> None:
    installs = [(spec, c) for _, spec, c in image_containers() if argv(c)[0] in ("sh", "/bin/sh")]
    assert installs, "the DaemonSet installs the image's shim on the node"
    for index, (spec, container) in enumerate(installs):
        root = tmp_path / str(index)
        image = root / "image"
        shipped = image / image_shim_path().lstrip("/")
        shipped.parent.mkdir(parents=True)
        shipped.write_bytes(b"\x7fELF the shim")
        shipped.chmod(0o755)
        script = argv(container)[2].replace(image_shim_path(), str(shipped))
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = sorted(container["volumeMounts"], key=lambda m: -len(m["mountPath"]))
        for mount in mounts:
            script = script.replace(mount["mountPath"], str(root / "host" / mount["name"]))
        for _ in range(2):  # a reinstall (an upgrade) replaces the library in place
            subprocess.run(["sh", "-c", script], check=True, timeout=30)
        placed = [p for p in (root / "host").rglob("*") if p.is_file()]
        assert len(placed) == 1 and placed[0].read_bytes() == b"\x7fELF the shim"
        assert placed[0].stat().st_mode & stat.S_IROTH, "containers of any user read the shim"
        volume_name, *rest = placed[0].relative_to(root / "host").parts
        host_file = str(Path(volumes[volume_name]["hostPath"]["path"], *rest))
        daemon = next((c for c in spec["containers"] if argv(c)[:2] in (["devplugin", "serve"],
                                                                        ["devplugin", "dra"])), None)
        assert daemon, "the shim is installed beside a node daemon (`devplugin serve` or `devplugin dra`)"
        env = {e["name"]: e.get("value") for e in daemon.get("env", [])}
        if argv(daemon)[1] == "dra":
            assert host_file == env.get("DEVPLUGIN_DRA_SHIM_LIB", DraConfig().shim_lib)
        else:
            assert host_file == env.get("DEVPLUGIN_SHIM_LIB", Config().shim_lib)
