"""What a container cannot do to its limits or to other containers' accounting, whatever its processes try:
plant a symlink or a hard link for the usage file, edit the usage file, override the limits from the env, drop
LD_PRELOAD, or bring the CUDA runtime linked statically."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from devplugin import contract
from tests.support.shim_probe import (
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS,
    SHIM,
    TESTS,
    GiB,
    MiB,
    run,
    run_full,
    start,
    until,
)
from tests.support.shim_probe import node as node  # the fixture

DEV0_LIMIT = 64 + 96  # struct gs_region: the 64-byte header, then dev[0] = {char uuid[96]; uint64_t limit}


def neighbour_cache(node, tmp_path: Path) -> Path:
    """Another container's usage file, with 256 MiB in use by a process that has ended normally."""
    other = tmp_path / "other"
    other.mkdir()
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", CUDA_DEVICE_MEMORY_SHARED_CACHE=other / "usage.cache")
    assert run(env, "init", "ctx", 0, "alloc", "256m")[2]["rc"] == CUDA_SUCCESS
    return other / "usage.cache"


def test_a_symlink_planted_for_the_usage_file_refuses_cuda_and_leaves_the_target_alone(node, tmp_path):
    target = neighbour_cache(node, tmp_path)
    before = target.read_bytes()
    node.cache.symlink_to(target)
    result = run_full(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "alloc", "1m")
    assert [s["rc"] for s in result.steps] == [CUDA_ERROR_NOT_PERMITTED] * 3
    assert "symbolic link" in result.stderr and str(node.cache) in result.stderr
    assert target.read_bytes() == before


def test_a_hard_link_to_another_container_s_usage_file_is_refused(node, tmp_path):
    target = neighbour_cache(node, tmp_path)
    os.link(target, node.cache)
    result = run_full(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init")
    assert result.steps[0]["rc"] == CUDA_ERROR_NOT_PERMITTED
    assert "one link" in result.stderr


def test_the_usage_file_is_created_for_the_container_only(node):
    old = os.umask(0)
    try:
        run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "alloc", "1m")
    finally:
        os.umask(old)
    mode = stat.S_IMODE(node.cache.stat().st_mode)
    assert mode == 0o660, oct(mode)  # even with umask 0: never writable by others


def limits_file(node, *per_gpu: tuple[int, int]) -> Path:
    return node.write_limits(contract.Limits(
        devices=tuple(contract.DeviceLimit(node.uuid(i), mem, 100) for i, mem in per_gpu)))


def test_editing_the_usage_file_does_not_raise_the_limit(node):
    env = node.env(GPUSHARE_LIMITS_FILE=limits_file(node, (0, 1 * GiB)))
    holder = start(env, "init", "ctx", 0, "alloc", "512m", "ready")
    try:
        until(holder, "ready")
        # A process of the container writes a huge limit into the usage file.
        with open(node.cache, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
            struct.pack_into("<Q", mm, DEV0_LIMIT, 64 * GiB)
        steps = run(env, "init", "ctx", 0, "fill", "alloc", "128m", "nvml", 0)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    assert steps[2]["bytes"] == 512 * MiB  # the limit comes from the read-only limits file only
    assert steps[3]["total"] == GiB


def test_env_overrides_do_not_beat_the_limits_file(node):
    path = limits_file(node, (0, 1 * GiB))
    env = node.env(GPUSHARE_LIMITS_FILE=path, NVIDIA_VISIBLE_DEVICES="all", CUDA_DEVICE_MEMORY_LIMIT="64g",
                   CUDA_DEVICE_MEMORY_LIMIT_0="64g", CUDA_DEVICE_MEMORY_LIMIT_1="64g")
    result = run_full(env, "init", "ctx", 0, "fill", "alloc", "256m", "ctx", 1, "alloc", "1m")
    assert result.steps[0]["devices"] == 2  # the process sees both GPUs...
    assert result.steps[2]["bytes"] == GiB  # ...GPU 0 stays at its limit...
    assert result.steps[3]["rc"] == CUDA_ERROR_NOT_PERMITTED  # ...and GPU 1, not in the file, cannot be used
    assert f"CUDA device 1 ({node.uuid(1)}) is not in the limits file" in result.stderr


def run_in_namespace(tmp_path: Path, env: dict[str, str], steps: list[str | int], limits: str | None = None,
                     ) -> tuple[list[dict], str]:
    """Run the probe as a container process would, in a user and mount namespace: without LD_PRELOAD, with an
    /etc/ld.so.preload that names the shim, and (given `limits`) the daemon's read-only limits file at
    /etc/gpushare/limits with a fresh /var/run/gpushare. Its steps and stderr."""
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")
    farm, real = tmp_path / "etc", tmp_path / "realetc"
    farm.mkdir()
    real.mkdir()
    script = ["set -e", f"mount --bind /etc {real}",
              f"for f in {real}/* {real}/.[!.]*; do [ -e \"$f\" ] && ln -s \"$f\" {farm}/ || true; done",
              f"echo {SHIM} > {farm}/ld.so.preload"]
    if limits is not None:
        (farm / "gpushare").mkdir()
        (farm / "gpushare" / "limits").write_text(limits)
        (farm / "gpushare" / "limits").chmod(0o444)
        script += ["mount -t tmpfs none /run", "mkdir -m 0770 /run/gpushare"]
    script += [f"mount --bind {farm} /etc", 'exec "$@"']
    (tmp_path / "ns.sh").write_text("\n".join(script) + "\n")
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    probe = subprocess.run(["unshare", "-rm", "sh", str(tmp_path / "ns.sh"), str(TESTS / "gs_probe"), "gpa",
                            *map(str, steps)], env=env, capture_output=True, text=True, timeout=60)
    if probe.returncode and "unshare" in probe.stderr:
        pytest.skip(f"no user namespaces here: {probe.stderr.strip()}")
    assert probe.returncode == 0, probe.stderr
    return [json.loads(line) for line in probe.stdout.splitlines() if line.strip()], probe.stderr


def test_without_ld_preload_the_shim_still_loads_from_ld_so_preload(node, tmp_path):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g")
    steps, _ = run_in_namespace(tmp_path, env, ["init", "ctx", 0, "fill", "alloc", "256m", "stats", 0])
    assert steps[2]["bytes"] == GiB and steps[2]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
    assert steps[3]["shim"] is True


def test_under_the_daemon_s_limits_file_the_env_cannot_move_the_accounting_nor_shrink_the_context(node, tmp_path):
    limits = contract.render_limits(contract.Limits(devices=(contract.DeviceLimit(node.uuid(0), GiB, 100),)))
    elsewhere = tmp_path / "private.cache"
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="64g", GPUSHARE_LIMITS_FILE=node.write_limits(
        contract.Limits(devices=(contract.DeviceLimit(node.uuid(0), 64 * GiB, 100),)), "generous"),
        CUDA_DEVICE_MEMORY_SHARED_CACHE=elsewhere, GPUSHARE_CONTEXT_RESERVE=0, CUDA_VISIBLE_DEVICES="0")
    steps, stderr = run_in_namespace(tmp_path, env, ["init", "ctx", 0, "meminfo", "fill", "alloc", "256m"],
                                     limits=limits)
    assert steps[2]["total"] == GiB and steps[2]["free"] == GiB - 256 * MiB  # the default context charge holds
    assert steps[3]["bytes"] == 768 * MiB  # 1 GiB less the 256 MiB context
    assert not elsewhere.exists()  # the accounting stayed in the daemon's state directory
    assert "is ignored: the daemon's limits file /etc/gpushare/limits is mounted" in stderr


def test_a_statically_linked_cuda_runtime_is_held_too(node):
    # cudart_static has no link to libcuda: it dlopens libcuda.so.1 and takes every entry point from
    # cuGetProcAddress, exactly as gs_probe's "gpa" mode does. The shim's dlsym and cuGetProcAddress hand it
    # the hooks.
    ldd = shutil.which("ldd")
    if ldd:
        linked = subprocess.run([ldd, str(TESTS / "gs_probe")], capture_output=True, text=True).stdout
        assert "libcuda" not in linked
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 0, "fill", "async", "256m",
                "fill", "create", "256m", mode="gpa")
    assert [s["bytes"] for s in steps if s["op"] == "fill"] == [GiB, 0]
