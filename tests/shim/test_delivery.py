"""Allocate delivers the shim: mounts, a limits file with the container's memory and compute, cleanup after."""

from __future__ import annotations

from pathlib import Path

from devplugin import contract
from devplugin.allocation.units import Kind
from devplugin.app.serve import shim_mounts
from devplugin.isolation.shim_delivery import Janitor
from devplugin.isolation.shim_files import ShimPaths
from tests.deviceplugin.test_kubelet_admission import pod
from tests.support.daemon_harness import CORE, MEM, running


def test_seed_job_gets_the_shim_and_its_limits_file() -> None:
    with running(shim="on", shim_lib="/bin/true") as r:
        assert r.registered_all()
        c = r.kubelet.admit(pod("cuda-sample", mem=2, core=30)).containers[0]
        mounts = {m.container_path: m for m in c.mounts}
        assert set(mounts) == {contract.CONTAINER_LIB_PATH, contract.CONTAINER_PRELOAD_PATH,
                               contract.CONTAINER_LIMITS_PATH, contract.CONTAINER_SHARED_CACHE,
                               contract.CONTAINER_GPU_LOCK_DIR}
        assert mounts[contract.CONTAINER_GPU_LOCK_DIR].read_only
        assert mounts[contract.CONTAINER_LIB_PATH].read_only and mounts[contract.CONTAINER_LIMITS_PATH].read_only
        assert mounts[contract.CONTAINER_PRELOAD_PATH].read_only
        assert not mounts[contract.CONTAINER_SHARED_CACHE].read_only
        limits = contract.parse_limits(Path(mounts[contract.CONTAINER_LIMITS_PATH].host_path).read_text())
        assert limits.devices == (contract.DeviceLimit(r.daemon.node.gpus[0].uuid, 2 << 30, 30),)
        # HAMi-core's name for the accounting file points into the mounted directory (for libvgpu.so users)
        assert c.envs[contract.ENV_SHARED_CACHE] == contract.CONTAINER_SHARED_CACHE
        assert c.conflicts == []


def test_shim_on_without_the_library_refuses_to_start() -> None:
    from devplugin.app.config import Config

    try:
        shim_mounts(Config(shim="on", shim_lib="/nonexistent/libgpushare.so"))
    except ValueError as exc:
        assert "does not exist" in str(exc)
    else:
        raise AssertionError("--shim on without the library must refuse")
    assert shim_mounts(Config(shim="auto", shim_lib="/nonexistent/libgpushare.so")) is None


def test_janitor_removes_files_of_ended_containers_only() -> None:
    with running(shim="on", shim_lib="/bin/true") as r:
        assert r.registered_all()
        keep = r.kubelet.admit(pod("keep", mem=1, core=5))
        gone = r.kubelet.admit(pod("gone", mem=1, core=5))
        host_dirs = {Path(m.host_path).parent.name for res in (keep, gone) for m in res.containers[0].mounts
                     if m.container_path == contract.CONTAINER_LIMITS_PATH}
        assert len(host_dirs) == 2
        r.kubelet.remove_pod(gone.pod.uid)
        paths = ShimPaths(host_root=Path(r.daemon_config.shim_state_dir), host_lib=Path("/bin/true"))
        janitor = Janitor(paths, str(r.pod_resources), {MEM: Kind.MEM, CORE: Kind.CORE}, min_age_s=0)
        removed = janitor.sweep()
        assert len(removed) == 1
        left = {d.name for d in (Path(r.daemon_config.shim_state_dir) / "containers").iterdir()}
        assert left == host_dirs - set(removed)


def test_janitor_deletes_nothing_when_the_kubelet_cannot_say(tmp_path: Path) -> None:
    (tmp_path / "containers" / "abc").mkdir(parents=True)
    janitor = Janitor(ShimPaths(host_root=tmp_path), "/nonexistent.sock", {MEM: Kind.MEM}, min_age_s=0)
    assert janitor.sweep() == []
    assert (tmp_path / "containers" / "abc").is_dir()


def test_cleanup_keeps_a_young_directory_whose_container_may_still_be_starting(tmp_path: Path) -> None:
    from devplugin.isolation.shim_files import cleanup

    (tmp_path / "containers" / "abc").mkdir(parents=True)
    paths = ShimPaths(host_root=tmp_path)
    assert cleanup(paths, set(), min_age_s=600) == []
    assert cleanup(paths, set()) == ["abc"]


def test_two_containers_whose_names_share_40_characters_each_get_their_own_limits(api) -> None:  # type: ignore[no-untyped-def]
    """Kubernetes allows 63-character container names: the shim's host directory is named by the full name, so a
    second container sharing the first 40 characters never overwrites the first's limits."""
    prefix = "model-server-with-a-rather-long-name-0123"  # 41 characters
    names = (prefix + "-small", prefix + "-large")
    with running(apiserver=api, shim="on", shim_lib="/bin/true") as r:
        assert r.registered_all()
        p = r.pod("long-names", containers=[{"name": names[0], "limits": {"mem": 2, "core": 20}},
                                            {"name": names[1], "limits": {"mem": 10, "core": 60}}])
        assert r.wait_cached(p)
        got = {c.name: c for c in r.admit(p).containers}  # type: ignore[attr-defined]
        limits_paths = {}
        for name, (mem, core) in zip(names, ((2, 20), (10, 60)), strict=True):
            mounts = {m.container_path: m.host_path for m in got[name].mounts}
            limits_paths[name] = mounts[contract.CONTAINER_LIMITS_PATH]
            assert Path(limits_paths[name]).parent.name.endswith("-" + name)
            (dev,) = contract.parse_limits(Path(limits_paths[name]).read_text()).devices
            assert (dev.memory_limit, dev.sm_limit) == (mem << 30, core)
        assert limits_paths[names[0]] != limits_paths[names[1]]
