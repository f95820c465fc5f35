"""Delivering the shim: the host files the daemon writes per container and the mounts Allocate returns."""

from __future__ import annotations

import os
import stat

import pytest

from devplugin import contract
from devplugin.allocation.ports import MountSpec
from devplugin.isolation.shim_files import Owner, ShimPaths, cleanup, prepare_container
from tests.support.shim_probe import GiB, make_node, run

UUID_A = "GPU-0b6a1c2d-1111-2222-3333-444455556666"
UUID_B = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"


@pytest.fixture
def paths(tmp_path) -> ShimPaths:
    return ShimPaths(host_root=tmp_path / "run", host_lib=tmp_path / "lib" / "libgpushare.so")


def limits(*devices: tuple[str, int, int], policy: str = "default") -> contract.Limits:
    return contract.Limits(devices=tuple(contract.DeviceLimit(*d) for d in devices), core_policy=policy)


def test_the_mounts_deliver_library_preload_limits_and_state(paths):
    mounts = prepare_container(paths, "pod-1-c0", limits((UUID_A, 2 * GiB, 100)))
    cdir = paths.host_root / "containers" / "pod-1-c0"
    assert mounts == [
        MountSpec(contract.CONTAINER_LIB_PATH, str(paths.host_lib), True),
        MountSpec(contract.CONTAINER_PRELOAD_PATH, str(paths.host_root / "ld.so.preload"), True),
        MountSpec(contract.CONTAINER_LIMITS_PATH, str(cdir / "limits"), True),
        MountSpec(contract.CONTAINER_SHARED_CACHE, str(cdir / "state" / "usage.cache"), False),
        MountSpec(contract.CONTAINER_GPU_LOCK_DIR, str(paths.host_root / "gpu-locks"), True),
    ]
    assert (paths.host_root / "ld.so.preload").read_text() == contract.CONTAINER_LIB_PATH + "\n"
    lock = paths.host_root / "gpu-locks" / f"{UUID_A}.lock"
    assert lock.exists() and stat.S_IMODE(lock.stat().st_mode) == 0o444  # flock needs no write access


def test_the_limits_file_is_read_only_complete_and_left_without_temporaries(paths):
    wanted = limits((UUID_A, 2 * GiB, 30), (UUID_B, 0, 100), policy="force")
    prepare_container(paths, "c1", wanted)
    path = paths.host_root / "containers" / "c1" / "limits"
    assert contract.parse_limits(path.read_text()) == wanted
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert stat.S_IMODE((paths.host_root / "ld.so.preload").stat().st_mode) == 0o444
    assert sorted(p.name for p in path.parent.iterdir()) == ["limits", "state"]


def test_the_container_gets_its_own_accounting_file_and_no_writable_directory(paths):
    """Only one file is writable (by any user of the container, whose uid the daemon cannot know), at the size the
    shim maps; its directory is root-only, so the container cannot make files or links on the host."""
    mounts = prepare_container(paths, "c1", limits((UUID_A, GiB, 100)))
    state = paths.host_root / "containers" / "c1" / "state"
    usage = state / "usage.cache"
    assert usage.is_file() and not usage.is_symlink() and usage.stat().st_size == contract.USAGE_FILE_SIZE
    assert stat.S_IMODE(usage.stat().st_mode) == 0o666 and stat.S_IMODE(state.stat().st_mode) == 0o700
    writable = [m for m in mounts if not m.read_only]
    assert writable == [MountSpec(contract.CONTAINER_SHARED_CACHE, str(usage), False)]
    assert not any(m.container_path == contract.CONTAINER_STATE_DIR for m in mounts)
    with open(usage, "r+b") as f:  # a second Allocate of the same container keeps what its processes wrote
        f.write(b"x")
    prepare_container(paths, "c1", limits((UUID_A, 0, 30)))
    assert usage.read_bytes()[:1] == b"x" and usage.stat().st_size == contract.USAGE_FILE_SIZE


def test_an_accounting_file_replaced_by_a_link_is_refused(paths):
    prepare_container(paths, "c1", limits((UUID_A, GiB, 100)))
    usage = paths.host_root / "containers" / "c1" / "state" / "usage.cache"
    usage.unlink()
    usage.symlink_to("/etc/passwd")
    with pytest.raises(OSError, match="is not a plain file; remove it"):
        prepare_container(paths, "c1", limits((UUID_A, GiB, 100)))


def test_two_allocates_for_one_container_merge_and_return_the_same_mounts(paths):
    first = prepare_container(paths, "c1", limits((UUID_A, 2 * GiB, 100)))  # gpu-mem
    second = prepare_container(paths, "c1", limits((UUID_A, 0, 30)))  # gpu-core.percentage
    assert first == second
    text = (paths.host_root / "containers" / "c1" / "limits").read_text()
    assert contract.parse_limits(text) == limits((UUID_A, 2 * GiB, 30))


def test_the_preload_file_is_written_once(paths):
    prepare_container(paths, "c1", limits((UUID_A, GiB, 100)))
    preload = paths.host_root / "ld.so.preload"
    before = preload.stat().st_ino
    prepare_container(paths, "c2", limits((UUID_A, GiB, 100)))
    assert preload.stat().st_ino == before


@pytest.mark.parametrize("alloc_id", ["", "../etc", "a/b", "Pod-1", "a b", "a" * 101, ".", "..", "c1\n", "-x"])
def test_alloc_ids_that_are_not_plain_names_are_refused(paths, alloc_id):
    with pytest.raises(ValueError, match="alloc_id"):
        prepare_container(paths, alloc_id, limits((UUID_A, GiB, 100)))
    assert not (paths.host_root / "containers").exists() or not any((paths.host_root / "containers").iterdir())


def test_limits_the_format_cannot_hold_are_refused(paths):
    with pytest.raises(contract.LimitsFileError):
        prepare_container(paths, "c1", limits((UUID_A, GiB, 0)))


def test_cleanup_removes_the_files_of_containers_whose_devices_are_no_longer_held(paths):
    for alloc_id in ("live-1", "gone-1", "gone-2"):
        prepare_container(paths, alloc_id, limits((UUID_A, GiB, 100)),
                          owner=Owner(devices=(f"{UUID_A}::m{alloc_id[-1]}-{alloc_id}",)))
    stray = paths.host_root / "containers" / "Not-An-Id"
    stray.mkdir()
    live = {f"{UUID_A}::m1-live-1", f"{UUID_A}::c9"}
    assert cleanup(paths, live) == ["gone-1", "gone-2"]
    assert sorted(p.name for p in (paths.host_root / "containers").iterdir()) == ["Not-An-Id", "live-1"]
    assert cleanup(paths, live) == []
    assert (paths.host_root / "ld.so.preload").exists()


def test_a_new_container_never_inherits_an_earlier_ones_files(paths):
    """The same directory name again (a container admitted anew): limits and usage cache start fresh."""
    prepare_container(paths, "uid1-main", limits((UUID_A, GiB, 30)), owner=Owner(devices=("x",)))
    state = paths.host_root / "containers" / "uid1-main" / "state"
    (state / "usage.cache").write_text("old usage")
    prepare_container(paths, "uid1-main", limits((UUID_A, 2 * GiB, 100)), owner=Owner(devices=("y",)), fresh=True)
    assert (state / "usage.cache").read_bytes() == bytes(contract.USAGE_FILE_SIZE)
    text = (paths.host_root / "containers" / "uid1-main" / "limits").read_text()
    assert contract.parse_limits(text) == limits((UUID_A, 2 * GiB, 100))


def test_containers_directory_is_root_only(paths):
    prepare_container(paths, "c1", limits((UUID_A, GiB, 100)))
    assert (paths.host_root / "containers").stat().st_mode & 0o777 == 0o700


def test_cleanup_before_any_container_is_a_no_op(paths):
    assert cleanup(paths, set()) == []


def test_the_shim_reads_the_file_the_daemon_writes(tmp_path, paths):
    node = make_node(tmp_path)
    prepare_container(paths, "c1", limits((node.uuid(0), GiB, 100), (node.uuid(1), 2 * GiB, 100)))
    env = node.env(GPUSHARE_LIMITS_FILE=paths.host_root / "containers" / "c1" / "limits",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=paths.host_root / "containers" / "c1" / "state" / "usage.cache")
    steps = run(env, "init", "ctx", 0, "fill", "alloc", "128m", "ctx", 1, "fill", "alloc", "128m")
    assert steps[2]["bytes"] == GiB and steps[4]["bytes"] == 2 * GiB
    assert os.path.exists(paths.host_root / "containers" / "c1" / "state" / "usage.cache")
