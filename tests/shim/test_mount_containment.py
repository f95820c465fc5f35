"""What the daemon's Allocate answers let a container reach, over the real path (kubelet emulator -> gRPC ->
allocator -> shim files, pod identity from the fake apiserver): its limits file and ld.so.preload read-only, its
own accounting directory (named by pod UID and container name) writable, nothing of any other container's.

The mounts are then made as a container runtime makes them (bind mounts, read-only ones remounted read-only) in a
user and mount namespace, where the "container" is root with every capability: it still cannot write, replace or
remove its limits file or ld.so.preload, and finds no other container's accounting. (The shim's side, the env not
overriding the mounted limits file, is tested in tests/shim/test_containment.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplugin import contract
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.support.daemon_harness import Running, running

REPO = Path(__file__).resolve().parents[2]
BUILT_SHIM = REPO / "build" / "shim" / "libgpushare.so"
PROTECTED = (contract.CONTAINER_LIB_PATH, contract.CONTAINER_PRELOAD_PATH, contract.CONTAINER_LIMITS_PATH)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, dict[str, dict[str, object]]]]:
    """Two pods admitted with the shim on: "a" with containers train and sidecar, "b" with main. Yields the
    running node and, per "pod/container", its pod UID and mounts (container path -> Mount)."""
    lib = BUILT_SHIM
    if not lib.exists():  # the mounts do not depend on the library's content
        lib = tmp_path_factory.mktemp("lib") / "libgpushare.so"
        lib.write_bytes(b"\x7fELF stand-in")
    with FakeApiserver() as api, running(apiserver=api, shim="on", shim_lib=str(lib)) as r:
        assert r.registered_all()
        a = r.pod("a", containers=[{"name": "train", "limits": {"mem": 4, "core": 30}},
                                   {"name": "sidecar", "limits": {"mem": 1, "core": 5}}])
        b = r.pod("b", mem=2, core=10)
        got: dict[str, dict[str, object]] = {}
        for pod in (a, b):
            assert r.wait_cached(pod)
            result = r.admit(pod)
            for cont in result.containers:
                assert not cont.conflicts
                got[f"{pod['metadata']['name']}/{cont.name}"] = {
                    "uid": pod["metadata"]["uid"], "mounts": {m.container_path: m for m in cont.mounts}}
        yield r, got


def test_limits_preload_and_library_are_mounted_read_only_and_only_the_accounting_file_is_writable(node) -> None:
    _, got = node
    for name, c in got.items():
        mounts = c["mounts"]
        assert set(mounts) == {*PROTECTED, contract.CONTAINER_SHARED_CACHE, contract.CONTAINER_GPU_LOCK_DIR}, name
        for path in (*PROTECTED, contract.CONTAINER_GPU_LOCK_DIR):
            assert mounts[path].read_only is True, f"{name}: {path} is writable"
        assert mounts[contract.CONTAINER_SHARED_CACHE].read_only is False
        assert Path(mounts[contract.CONTAINER_SHARED_CACHE].host_path).is_file()  # a file: no host directory


def test_each_container_has_its_own_directory_named_by_pod_uid_and_container(node) -> None:
    r, got = node
    containers = Path(r.daemon_config.shim_state_dir) / "containers"
    dirs = {}
    for name, c in got.items():
        limits = Path(c["mounts"][contract.CONTAINER_LIMITS_PATH].host_path)
        state = Path(c["mounts"][contract.CONTAINER_SHARED_CACHE].host_path).parent
        assert limits.parent == state.parent, name
        assert state.parent.parent == containers and state.name == "state", name
        assert state.parent.name == f"{c['uid']}-{name.split('/')[1]}", name
        dirs[name] = state.parent
    assert len(set(dirs.values())) == len(dirs)  # the two containers of pod a do not share one
    for name, c in got.items():
        others = [d for other, d in dirs.items() if other != name]
        for mount in c["mounts"].values():
            host = Path(mount.host_path)
            assert host not in (Path(r.daemon_config.shim_state_dir), containers), f"{name} sees every container"
            assert not any(host.is_relative_to(d) or d.is_relative_to(host) for d in others), (
                f"{name} reaches another container's files through {host}")


def test_host_modes_keep_other_users_out(node) -> None:
    r, got = node
    containers = Path(r.daemon_config.shim_state_dir) / "containers"
    assert stat.S_IMODE(containers.stat().st_mode) == 0o700  # no host user but root gets past here
    for name, c in got.items():
        mounts = c["mounts"]
        cdir = Path(mounts[contract.CONTAINER_LIMITS_PATH].host_path).parent
        assert stat.S_IMODE(cdir.stat().st_mode) & 0o022 == 0, f"{name}: {cdir} is writable by others"
        for path in (contract.CONTAINER_LIMITS_PATH, contract.CONTAINER_PRELOAD_PATH):
            assert stat.S_IMODE(Path(mounts[path].host_path).stat().st_mode) == 0o444, f"{name}: {path}"
        assert stat.S_IMODE((cdir / "owner").stat().st_mode) == 0o444
        # any user of the container writes its accounting file; the directory holding it is root's alone
        usage = Path(mounts[contract.CONTAINER_SHARED_CACHE].host_path)
        assert stat.S_IMODE(usage.stat().st_mode) == 0o666 and stat.S_IMODE(usage.parent.stat().st_mode) == 0o700


# Runs as root of a new user namespace, in a new mount namespace: mounts the container's files over a scratch
# root as a runtime would, then tries what a hostile container process would. Prints one JSON object.
INSIDE = r"""
import errno, json, os, subprocess, sys
root, mounts = sys.argv[1], json.loads(sys.argv[2])
for m in mounts:
    target = root + m["container_path"]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(m["host_path"]):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "a").close()
    subprocess.run(["mount", "--bind", m["host_path"], target], check=True)
    if m["read_only"]:
        subprocess.run(["mount", "-o", "remount,bind,ro", target], check=True)

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def write(path):
    with open(path, "w") as f:
        f.write("generous limits\n")

def replace(path):
    with open(path + ".mine", "w") as f:
        f.write("generous limits\n")
    try:
        os.rename(path + ".mine", path)
    finally:
        if os.path.exists(path + ".mine"):
            os.unlink(path + ".mine")

out = {}
for m in mounts:
    if m["read_only"] and os.path.isfile(m["host_path"]):
        target = root + m["container_path"]
        out[m["container_path"]] = {"write": attempt(lambda: write(target)),
                                    "replace": attempt(lambda: replace(target)),
                                    "remove": attempt(lambda: os.unlink(target)),
                                    "chmod": attempt(lambda: os.chmod(target, 0o666))}
out["state"] = attempt(lambda: write(root + sys.argv[3]))
out["seen"] = sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)
print(json.dumps(out))
"""


def run_as_container(tmp_path: Path, mounts: dict) -> dict:
    if not shutil.which("unshare") or not shutil.which("mount"):
        pytest.skip("unshare and mount (util-linux) are not installed")
    spec = [{"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only}
            for m in mounts.values()]
    root = tmp_path / "rootfs"
    root.mkdir()
    probe = subprocess.run(["unshare", "-rm", sys.executable, "-c", INSIDE, str(root), json.dumps(spec),
                            contract.CONTAINER_SHARED_CACHE], capture_output=True, text=True, timeout=60)
    if probe.returncode and "unshare" in probe.stderr:
        pytest.skip(f"no user namespaces here: {probe.stderr.strip()}")
    assert probe.returncode == 0, probe.stderr
    return json.loads(probe.stdout)


def test_a_container_cannot_change_its_limits_or_preload_nor_reach_another_container(node, tmp_path: Path) -> None:
    _, got = node
    mine, other = got["a/train"]["mounts"], got["b/main"]["mounts"]
    protected = {p: Path(mine[p].host_path).read_bytes() for p in PROTECTED}
    marker = Path(other[contract.CONTAINER_SHARED_CACHE].host_path)
    before = marker.read_bytes()
    marker.write_text("b's accounting")
    try:
        out = run_as_container(tmp_path, mine)
    finally:
        marker.write_bytes(before)
    for path in PROTECTED:
        assert out[path]["write"] == "EROFS" and out[path]["chmod"] == "EROFS", (path, out[path])
        assert out[path]["replace"] == "EBUSY" and out[path]["remove"] == "EBUSY", (path, out[path])
        assert Path(mine[path].host_path).read_bytes() == protected[path]  # unchanged on the host
    assert out["state"] == "ok"  # its own accounting is writable ...
    own = Path(mine[contract.CONTAINER_SHARED_CACHE].host_path)
    assert own.read_text() == "generous limits\n"
    seen = [Path(p).relative_to(tmp_path / "rootfs") for p in out["seen"]]
    # ... and is all it sees of the accounting: b's usage file is nowhere under its root
    locks = [p for p in seen if str(p).startswith(contract.CONTAINER_GPU_LOCK_DIR.lstrip("/"))]
    assert locks and all(p.suffix == ".lock" for p in locks)  # the node's GPU locks: empty, read-only
    assert sorted(p for p in seen if p not in locks) == sorted(
        Path(p.lstrip("/")) for p in [*PROTECTED, contract.CONTAINER_SHARED_CACHE])
    assert not os.path.exists(tmp_path / "rootfs" / "b")
