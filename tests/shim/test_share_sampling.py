"""The compute share when the driver's per-process samples each name one process, and when a runtime's first
context call does not make NVML list the process: both seen on a real H100 with driver 580 (docs/benchmarks.md,
"On a real GPU").

There, nvmlDeviceGetProcessUtilization gives an entry every 200 ms naming the one process resident on the GPU at
that moment with the whole GPU's use, so a container's part shows only as its part of the entries over seconds. A
shim that read a sample as "this process's use" starved a 30 % container beside a busy neighbour (7 % of the GPU)
and let a 30 % burster keep 59 % from a 70 % neighbour. The fake driver samples the same way here
(`resident_samples`); each container's share is read from the fake GPU's timeline, not from the shim.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from devplugin_sim.gpu_share import PROBE, Container, Run, Workload, make_gpu, measure_reclaim, measure_steady, shares
from tests.support.shim_probe import require_built

SAMPLE_MS = 20  # the real driver samples every 200 ms: the same reading, learnt ten times as slowly
SETTLE = 6.0  # s: each sample names one process, so a container's part takes seconds of samples to tell
WINDOW = 8.0  # s measured
TOLERANCE = 5  # percentage points, for the containers that both hold a share
WANDER = 7  # beside a neighbour without the shim (its launches never wait): a part read from samples that each
#             name one process wanders by a few points more


@pytest.fixture
def resident_gpu(tmp_path):
    require_built()
    driver = make_gpu(tmp_path / "node", sample_period_ms=SAMPLE_MS, resident_samples=True)
    yield driver
    driver.close()


def test_shares_hold_when_each_sample_names_one_process(resident_gpu, tmp_path):
    got = measure_steady(resident_gpu, tmp_path, [Container("a", 70), Container("b", 30)], settle=SETTLE,
                         window=WINDOW)
    assert abs(got["a"] - 70) <= TOLERANCE and abs(got["b"] - 30) <= TOLERANCE, got


def test_a_share_beside_a_busy_neighbour_is_held_not_starved(resident_gpu, tmp_path):
    # The neighbour runs without the shim and takes all it can: the 30 % container still gets its 30 % (a shim
    # that read a sample as the process's own use fell back to the whole GPU's, always busy, and was starved).
    # The neighbour starts half a second later: a process outside the shim that creates its context at the same
    # moment cannot be told apart (tests/shim/test_share.py), which is not what this test is about.
    run = Run(resident_gpu, tmp_path, Workload(), SETTLE + WINDOW + 1.5)
    held, busy = Container("held", 30), Container("busy", 100, shim=False)
    try:
        run.start(held)
        time.sleep(0.5)
        run.start(busy, seconds=SETTLE + WINDOW + 0.5)
        time.sleep(SETTLE)
        t0, before = time.monotonic(), run.busy()
        time.sleep(WINDOW)
        got = shares(before, run.busy(), time.monotonic() - t0)
        run.finish()
    finally:
        run.stop()
    assert abs(got["held"] - 30) <= WANDER, got  # the shim that read a sample as the process's use: 0.2 %
    assert got["busy"] >= 60, got


def test_default_gives_an_idle_gpu_back_when_each_sample_names_one_process(resident_gpu, tmp_path):
    burster = Container("burster", share=30, policy="default")
    neighbour = Container("neighbour", share=70, policy="force")
    r = measure_reclaim(resident_gpu, tmp_path, burster, neighbour, alone=3.0, together=8.0)
    assert r.alone >= 60, r.alone
    # Given back and held so: over the second half of the 8 s together (tests/shim/test_share.py bounds how soon,
    # with the fake's shared samples).
    assert r.after["neighbour"] >= 70 - WANDER and r.after["burster"] <= 30 + WANDER, r.after


def test_a_process_nvml_lists_only_at_its_second_context_call_finds_its_pid(tmp_path):
    # The first context call (a runtime looking its primary context up) makes no process appear in NVML's list;
    # the second creates it. The process is found at the second, not given up at the first.
    require_built()
    driver = make_gpu(tmp_path / "node")
    try:
        run = Run(driver, tmp_path, Workload(), 1.0)
        env = run.env(Container("late", share=30, policy="force", env={"FAKE_CUDA_LISTED_AFTER": "2"}))
        proc = subprocess.run([str(PROBE), "gpa", "init", "ctx", "0", "ctx", "0", "launchfor", "launch", "300",
                               "1000", "stats", "0"], env=env, capture_output=True, text=True, timeout=60)
        host_pid_offset = driver.host_pid_offset
    finally:
        driver.close()
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(next(line for line in proc.stdout.splitlines() if '"op":"stats"' in line))
    assert stats["nvml_pid"] > host_pid_offset, proc.stdout + proc.stderr  # its own host pid, not -1
    assert "cannot tell this process's NVML pid" not in proc.stderr
