"""Compute shares between containers on one (fake) GPU, with the real shim preloaded into every process.

Every process runs kernels of 1000 blocks x 1 us back to back on the fake GPU's shared timeline; each container
has its own usage file; the fake NVML reports the processes under host pids (pid + 100000), never their own.
What each container got is read from the timeline (devplugin_sim.gpu_share), not from the shim.
"""

from __future__ import annotations

import json
import time

import pytest

from devplugin_sim.gpu_share import Container, Run, Workload, make_gpu, measure_reclaim, measure_steady, shares
from tests.support.shim_probe import CUDA_ERROR_NOT_PERMITTED, make_node, require_built, run_full

SETTLE = 1.5  # s: the controller's first steps (100 ms each) and the pool's first fill
WINDOW = 1.5  # s measured
TOLERANCE = 5  # percentage points


@pytest.fixture
def gpu(tmp_path):
    require_built()
    driver = make_gpu(tmp_path / "node")
    yield driver
    driver.close()


def steady(gpu, tmp_path, containers: list[Container]) -> dict[str, float]:
    return measure_steady(gpu, tmp_path, containers, settle=SETTLE, window=WINDOW)


@pytest.mark.parametrize("shares", [(70, 30), (50, 25, 25), (30,)], ids=["70+30", "50+25+25", "30-alone"])
def test_each_container_holds_its_share_under_force(gpu, tmp_path, shares):
    containers = [Container(f"c{i}", share=s, policy="force") for i, s in enumerate(shares)]
    got = steady(gpu, tmp_path, containers)
    for c in containers:
        assert abs(got[c.name] - c.share) <= TOLERANCE, got


def test_shares_hold_when_the_driver_samples_slowly(tmp_path):
    # Per-process samples every 500 ms (real drivers sample less often than the fake's 50 ms): the controller
    # adds up the tokens until a sample comes, and the shares still hold.
    driver = make_gpu(tmp_path / "node", sample_period_ms=500)
    try:
        got = measure_steady(driver, tmp_path, [Container("a", 70), Container("b", 30)], settle=2.0, window=2.0)
    finally:
        driver.close()
    assert abs(got["a"] - 70) <= TOLERANCE and abs(got["b"] - 30) <= TOLERANCE, got


@pytest.mark.parametrize("neighbour_shim", [True, False], ids=["neighbour-unlimited", "neighbour-without-shim"])
def test_a_share_holds_beside_a_busy_container_with_no_core_limit(gpu, tmp_path, neighbour_shim):
    held = Container("held", share=30, policy="force")
    busy = Container("busy", share=100, shim=neighbour_shim)
    got = steady(gpu, tmp_path, [held, busy])
    assert abs(got["held"] - 30) <= TOLERANCE, got
    assert got["busy"] >= 60, got  # the rest goes to the neighbour


def test_the_share_is_the_containers_not_each_processes(gpu, tmp_path):
    # Three processes of one 30 % container draw from one bucket: together 30 %, not 3 x 30 %.
    many = Container("many", share=30, policy="force", processes=3)
    other = Container("other", share=70, policy="force")
    got = steady(gpu, tmp_path, [many, other])
    assert abs(got["many"] - 30) <= TOLERANCE, got
    assert abs(got["other"] - 70) <= TOLERANCE, got


def test_default_uses_an_idle_gpu_and_gives_it_back_when_a_neighbour_starts(gpu, tmp_path):
    burster = Container("burster", share=30, policy="default")
    neighbour = Container("neighbour", share=70, policy="force")
    r = measure_reclaim(gpu, tmp_path, burster, neighbour, alone=2.0, together=2.5)
    assert r.alone >= 60, r.alone  # alone on an idle GPU it uses most of it
    assert r.reclaim_s is not None and r.reclaim_s <= 1.0, r.trace  # bounded: one control step + a sample
    assert abs(r.after["neighbour"] - 70) <= TOLERANCE, r.after
    assert abs(r.after["burster"] - 30) <= TOLERANCE, r.after


def test_each_process_records_its_host_pid_not_its_own(gpu, tmp_path):
    # Five processes of one container start at once; each finds its own NVML pid (the fake reports pid + 100000).
    run_ = Run(gpu, tmp_path, Workload(), 1.0)
    c = Container("c", share=40, policy="force", processes=5)
    try:
        run_.start(c, seconds=0.2)
        outs = run_.finish()
    finally:
        run_.stop()
    stats = [next(line for line in out.splitlines() if '"op":"stats"' in line) for out in outs]
    for pid, line in zip(c.pids, stats, strict=True):
        s = json.loads(line)
        assert s["pid"] == pid and s["nvml_pid"] == pid + gpu.host_pid_offset, s


def test_disable_holds_nothing(gpu, tmp_path):
    got = steady(gpu, tmp_path, [Container("free", share=30, policy="disable")])
    assert got["free"] >= 90, got


def test_a_share_without_a_usable_usage_file_is_refused(tmp_path):
    # The share must hold across the container's processes; without the shared file it cannot: CUDA is refused,
    # with a message that says why.
    node = make_node(tmp_path)
    env = node.env(CUDA_DEVICE_SM_LIMIT=30, CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "missing" / "usage"))
    result = run_full(env, "init", "ctx", 0, "launch", 1, 1)
    assert [s["rc"] for s in result.steps] == [CUDA_ERROR_NOT_PERMITTED] * 3
    assert "refusing CUDA" in result.stderr and "compute share" in result.stderr


def test_a_gpu_lock_directory_that_cannot_be_used_is_named_and_the_context_still_made(tmp_path):
    # The lock only keeps two containers' context creations apart: without it CUDA goes on, and the warning
    # names the lock file and what is no longer guaranteed.
    node = make_node(tmp_path)
    missing = tmp_path / "no-such-dir"
    env = node.env(CUDA_DEVICE_SM_LIMIT=30, GPUSHARE_GPU_LOCK_DIR=str(missing))
    result = run_full(env, "init", "ctx", 0, "launch", 1, 1)
    assert [s["rc"] for s in result.steps] == [0, 0, 0]
    assert f"cannot open the GPU lock {missing}/" in result.stderr, result.stderr
    assert "not guaranteed" in result.stderr


def stats_of(out: str) -> dict:
    return json.loads(next(line for line in out.splitlines() if '"op":"stats"' in line))


def test_containers_starting_together_each_find_their_own_host_pid(gpu, tmp_path):
    # Contexts take 300 ms to create, and two containers create theirs at the same moment: the per-GPU lock
    # (GPUSHARE_GPU_LOCK_DIR) serialises the before/after lists, so neither takes the other's pid.
    run_ = Run(gpu, tmp_path, Workload(context_ms=300), 3.0)
    a, b = Container("a", share=30, policy="force"), Container("b", share=70, policy="force")
    try:
        for c in (a, b):
            run_.start(c, seconds=0.1)
        outs = run_.finish()
    finally:
        run_.stop()
    for pid, out in zip(a.pids + b.pids, outs, strict=True):
        assert stats_of(out)["nvml_pid"] == pid + gpu.host_pid_offset, out


def test_a_pid_that_cannot_be_told_apart_is_not_guessed(gpu, tmp_path):
    # A process outside the shim creates a context while a shim process creates its own (300 ms): two new pids
    # appear. The shim records none, says so, and holds the share against the whole GPU (never above it).
    run_ = Run(gpu, tmp_path, Workload(context_ms=300), 3.0)
    held = Container("held", share=30, policy="force")
    outsider = Container("outsider", shim=False, env={"FAKE_CUDA_CONTEXT_DELAY_MS": "0"})
    try:
        run_.start(held, seconds=1.5)
        time.sleep(0.1)
        run_.start(outsider, seconds=1.5)
        outs = run_.finish()
    finally:
        run_.stop()
    stats = stats_of(outs[0])
    assert stats["nvml_pid"] == -1, outs[0]
    assert "could not be told apart" in outs[0] and "whole GPU" in outs[0]
    assert stats["used_pct"] == stats["gpu_pct"]  # measured as the whole GPU


def test_without_per_process_utilisation_the_share_holds_against_the_whole_gpu(gpu, tmp_path):
    # A driver that reports no per-process utilisation: the share is held against the whole GPU (never above
    # it), with a warning that says so.
    held = Container("held", share=30, policy="force", env={"FAKE_NVML_PROCESS_UTILIZATION": "0"})
    run_ = Run(gpu, tmp_path, Workload(), 3.0)
    try:
        run_.start(held, seconds=2.5)
        time.sleep(1.2)
        t0, before = time.monotonic(), run_.busy()
        time.sleep(1.0)
        got = shares(before, run_.busy(), time.monotonic() - t0)["held"]
        out = run_.finish()[0]
    finally:
        run_.stop()
    assert abs(got - 30) <= TOLERANCE, got
    assert "no per-process utilisation" in out and "whole GPU" in out
