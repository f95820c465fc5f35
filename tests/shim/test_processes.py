"""Accounting across the processes of one container: one limit for all, and nothing lost to dead processes."""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import struct
import subprocess

import pytest

from tests.support.shim_probe import CUDA_ERROR_OUT_OF_MEMORY, TESTS, GiB, go_on_together, make_node, run, start, until
from tests.support.shim_probe import node as node  # the fixture


def test_four_forked_processes_share_one_limit(node):
    # The parent holds 256 MiB, then four children fill concurrently: together they get exactly the rest.
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="2g"), "init", "ctx", 0, "alloc", "256m",
                "forkfill", 4, "alloc", "32m", "meminfo")
    forked = steps[3]
    assert len(forked["children"]) == 4
    assert forked["total"] == 2 * GiB - 256 * (1 << 20)
    assert all(c["rc"] == CUDA_ERROR_OUT_OF_MEMORY for c in forked["children"])
    assert steps[4]["free"] == 2 * GiB - 256 * (1 << 20)  # the children are gone: their memory is back


def test_separate_processes_share_one_limit(node):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="2g")
    first = start(env, "init", "ctx", 0, "fill", "alloc", "256m", "free", "free", "ready")
    try:
        assert until(first, "ready")[2]["bytes"] == 2 * GiB
        second = run(env, "init", "ctx", 0, "fill", "alloc", "128m", "meminfo")
        assert second[2]["bytes"] == 512 << 20
        assert second[3]["free"] == 0 and second[3]["total"] == 2 * GiB
    finally:
        first.stdin.close()
        first.wait(timeout=10)


def test_a_process_killed_with_sigkill_gives_its_memory_back(node):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="2g")
    victim = start(env, "init", "ctx", 0, "fill", "alloc", "256m", "ready")
    assert until(victim, "ready")[2]["bytes"] == 2 * GiB
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    steps = run(env, "init", "ctx", 0, "fill", "alloc", "256m")
    assert steps[2]["bytes"] == 2 * GiB


def test_a_process_that_exits_gives_its_memory_back_at_once(node):
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="2g")
    assert run(env, "init", "ctx", 0, "fill", "alloc", "256m")[2]["bytes"] == 2 * GiB
    assert run(env, "init", "ctx", 0, "nvml", 0)[2]["used"] == 0


def kill_a_lock_holder(node) -> int:
    """Start a process that takes the accounting lock and half-registers a 1 GiB slot on GPU 0, then SIGKILL it."""
    holder = subprocess.Popen([str(TESTS / "gs_lock_holder"), str(node.cache), node.uuid(0), str(GiB)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
    finally:
        holder.kill()
        holder.wait(timeout=10)
    return holder.pid


def test_a_lock_holder_killed_mid_update_blocks_nobody(node):
    # A process dies holding the accounting file's lock, halfway through registering a slot that claims 1 GiB.
    kill_a_lock_holder(node)
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="2g"), "init", "ctx", 0, "fill", "alloc", "256m", timeout=20)
    assert steps[2]["bytes"] == 2 * GiB


def test_a_reused_pid_does_not_keep_a_dead_process_s_memory(node):
    # A slot written by a process that is gone, with the pid of a live process (this test's) but another
    # start time: the pid was reused, and the memory is given back.
    holder_pid = kill_a_lock_holder(node)
    with open(node.cache, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        slots = 64 + 16 * (96 + 8)  # struct gs_region: header, 16 GPU entries, then the slots
        assert struct.unpack_from("<i", mm, slots)[0] == holder_pid
        struct.pack_into("<iiQ", mm, slots, os.getpid(), 0, 1)  # alive pid, impossible start time
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="2g"), "init", "ctx", 0, "fill", "alloc", "256m")
    assert steps[2]["bytes"] == 2 * GiB


def test_racing_processes_and_threads_never_overshoot_the_limit_nor_leak(tmp_path):
    # The GPU has exactly the container's limit: if the shim ever let the container past it, the (fake) driver
    # itself would have to refuse an allocation, which it counts as mem_oom. One thread alone can hold up to
    # 8 x 256 MiB, so the limit is reached whether or not the machine lets the processes' threads overlap.
    node = make_node(tmp_path, n=1, memory_mib=1024)
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="1g")
    procs = [start(env, "init", "ctx", 0, "ready", "hammer", 4, 20000, "256m", "counters") for _ in range(3)]
    try:
        go_on_together(*procs)
        results = [until(proc, "counters")[-2:] for proc in procs]
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=30)
    assert sum(counters["mem_oom"] for _, counters in results) == 0
    assert sum(hammer["oom"] for hammer, _ in results) > 0  # the limit was reached, often
    assert all(hammer["other"] == 0 and hammer["ok"] > 0 for hammer, _ in results)
    assert run(env, "init", "ctx", 0, "fill", "alloc", "64m")[2]["bytes"] == GiB  # and nothing leaked


def test_a_slot_whose_process_cannot_be_verified_is_not_kept_forever(node):
    # A slot with a live pid (this test's) but no start time and no lease: nothing proves its owner is the
    # process that wrote it, so its memory is given back instead of being held forever.
    holder_pid = kill_a_lock_holder(node)
    with open(node.cache, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        slots = 64 + 16 * (96 + 8)
        assert struct.unpack_from("<i", mm, slots)[0] == holder_pid
        struct.pack_into("<iiQ", mm, slots, os.getpid(), 0, 0)
    steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="2g"), "init", "ctx", 0, "fill", "alloc", "256m")
    assert steps[2]["bytes"] == 2 * GiB


def test_a_process_in_another_pid_namespace_keeps_its_memory_counted(node):
    # Its pid means nothing here (kill and /proc see another process or none): the lease it holds on its slot
    # is what keeps it alive.
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")
    env = node.env(CUDA_DEVICE_MEMORY_LIMIT="2g")
    holder = subprocess.Popen(["unshare", "-rpf", str(TESTS / "gs_probe"), "gpa", "init", "ctx", "0", "alloc", "1g",
                               "ready"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        if not line:
            pytest.skip(f"no pid namespaces here: {holder.stderr.read().strip()}")
        until(holder, "ready")
        steps = run(env, "init", "ctx", 0, "fill", "alloc", "256m")
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    assert steps[2]["bytes"] == 1 * GiB
