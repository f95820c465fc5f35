"""The product's image, built here from the repository's Dockerfile (tests/realk8s/product_image.py), works as
shipped: run under runc as the shipped DaemonSet and Deployment run it (their commands, users, read-only roots, no
capabilities), the image's entrypoint answers, every module of the installed package imports, and the DaemonSet's
init container puts the shim on the host. A second build of unchanged sources reuses the first."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realk8s import product_image
from tests.realk8s.oci_run import Run, run_in_image

pytestmark = [
    pytest.mark.realk8s,
    pytest.mark.skipif(os.geteuid() != 0, reason="building and running the product's image needs root "
                                                 "(mmdebstrap, buildah's chroot isolation, runc)"),
]

REPO = Path(__file__).resolve().parents[3]
ALL_MODULES = ("import importlib, pkgutil, devplugin; "
               "names = [m.name for m in pkgutil.walk_packages(devplugin.__path__, 'devplugin.') "
               "if not m.name.endswith('__main__')]; "
               "[importlib.import_module(n) for n in names]; print(len(names), devplugin.__file__)")


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the Dockerfile builds from, copied once: the image and the reuse check see the same sources while the
    checkout changes."""
    path = tmp_path_factory.mktemp("checkout")
    product_image.stage_context(REPO, path)
    return path


@pytest.fixture(scope="module")
def image(snapshot: Path) -> dict[str, Any]:
    assert shutil.which("runc"), f"runc is missing: {product_image.TOOLS_HINT}"
    return product_image.build(product_image.DEFAULT_CACHE, repo=snapshot)


def workload(path: Path, kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == kind]
    return found


def container_run(image: dict[str, Any], container: dict[str, Any], args: list[str],
                  binds: dict[str, Path] | None = None) -> Run:
    """`args` run as the container's securityContext runs it: its user (the group from the image's /etc/passwd, as
    the runtime takes it), read-only root, capabilities dropped."""
    assert container["image"] == product_image.REFERENCE
    security = container.get("securityContext", {})
    uid = int(security.get("runAsUser", image["user"].split(":")[0]))
    passwd = (Path(image["rootfs"]) / "etc/passwd").read_text().splitlines()
    gid = next((int(line.split(":")[3]) for line in passwd if line.split(":")[2] == str(uid)), 0)
    dropped = security.get("capabilities", {}).get("drop", [])
    return Run(args=args, uid=uid, gid=gid, read_only_root=bool(security.get("readOnlyRootFilesystem")),
               capabilities=[] if "ALL" in dropped else Run(args=[]).capabilities, binds=binds or {})


def test_the_entry_holds_the_images_config(image: dict[str, Any]) -> None:
    rootfs = Path(image["rootfs"])
    assert image["entrypoint"] == ["devplugin"] and image["cmd"] == ["serve"]
    assert image["user"] == "0:0" and image["workingDir"] == "/"
    assert {"PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"} <= set(image["env"])
    assert image["id"].startswith("sha256:")
    assert (rootfs / "usr/local/bin/devplugin").is_file()
    assert not (rootfs / "etc/xdg").exists(), "the build's pip config mount point left in the image"
    assert not list((rootfs / "usr/bin").glob("gcc*")), "the runtime stage carries no compiler"


def test_the_shipped_manifests_name_the_image() -> None:
    daemonset = workload(REPO / "deploy/base/daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    deployment = workload(REPO / "deploy/scheduler/deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    images = {c["image"] for c in [*daemonset["initContainers"], *daemonset["containers"], *deployment["containers"]]}
    assert images == {product_image.REFERENCE}
    values = yaml.safe_load((REPO / "deploy/helm/gpushare/values.yaml").read_text())["image"]
    assert f"{values['repository']}:{values['tag']}" == product_image.REFERENCE


def test_the_entrypoint_answers(image: dict[str, Any], tmp_path: Path) -> None:
    done = run_in_image(image, Run(args=[*image["entrypoint"], "--help"]), tmp_path)
    assert done.returncode == 0, done.stderr
    for command in ("serve", "scheduler", "inspect"):
        assert command in done.stdout


def test_the_daemonsets_init_container_puts_the_shim_on_the_host(image: dict[str, Any], tmp_path: Path) -> None:
    spec = workload(REPO / "deploy/base/daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    (init,) = [c for c in spec["initContainers"] if c["name"] == "install-shim"]
    (mount,) = init["volumeMounts"]
    host = tmp_path / "host"
    host.mkdir()
    done = run_in_image(image, container_run(image, init, init["command"], {mount["mountPath"]: host}),
                        tmp_path / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    shim = host / "lib" / "libgpushare.so"
    header = shim.read_bytes()[:18]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[16:18], "little") == 3  # a shared object
    assert shim.read_bytes() == (Path(image["rootfs"]) / "opt/gpushare/lib/libgpushare.so").read_bytes()
    assert sorted(p.name for p in (host / "lib").iterdir()) == ["libgpushare.so"]  # renamed, no .new left


def test_the_daemonsets_node_daemon_runs_from_it(image: dict[str, Any], tmp_path: Path) -> None:
    spec = workload(REPO / "deploy/base/daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    (daemon,) = [c for c in spec["containers"] if c["name"] == "devplugin"]
    done = run_in_image(image, container_run(image, daemon, [*daemon["command"], "--help"]), tmp_path / "help")
    assert done.returncode == 0, done.stderr
    assert "devplugin serve" in done.stdout
    done = run_in_image(image, container_run(image, daemon, ["python", "-c", ALL_MODULES]), tmp_path / "modules")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1] == "/usr/local/lib/python3.11/site-packages/devplugin/__init__.py"


def test_the_scheduler_deployment_runs_from_it_as_its_user(image: dict[str, Any], tmp_path: Path) -> None:
    spec = workload(REPO / "deploy/scheduler/deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    (scheduler,) = spec["containers"]
    run = container_run(image, scheduler, [*scheduler["command"], "--help"])
    assert (run.uid, run.gid) == (65532, 65532), "the image's non-root user"
    done = run_in_image(image, run, tmp_path / "help")
    assert done.returncode == 0, done.stderr
    assert "devplugin scheduler" in done.stdout
    run.args = ["python", "-c", ALL_MODULES]
    done = run_in_image(image, run, tmp_path / "modules")
    assert done.returncode == 0, done.stderr


def test_unchanged_sources_reuse_the_build(image: dict[str, Any], snapshot: Path) -> None:
    started = time.monotonic()
    again = product_image.build(product_image.DEFAULT_CACHE, repo=snapshot)
    assert again == image
    assert time.monotonic() - started < 10
