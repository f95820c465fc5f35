"""The compute share of one process: launches slow down to the share of the (fake) GPU's time under `force`, every
launch entry point passes the gate, and the gate follows the GPU launched on. Containers side by side:
tests/shim/test_share.py."""

from __future__ import annotations

import pytest

from devplugin import contract
from tests.support.shim_probe import CUDA_SUCCESS, make_node, run

# Each launch of 100 blocks keeps the fake GPU busy for 100 us: 1000 launches per 100 ms at full speed. A 20 ms
# launch queue keeps the fake GPU busy while a loaded test machine does not schedule the launching thread.
SIM = {"FAKE_CUDA_NS_PER_BLOCK": "1000", "FAKE_CUDA_QUEUE_US": "20000"}
FULL_SPEED_PER_100MS = 1000


@pytest.fixture
def node(tmp_path):
    node = make_node(tmp_path)
    node.extra.update(SIM)
    return node


@pytest.mark.parametrize("share", [30, 60])
def test_launches_slow_down_to_the_share(node, share):
    steps = run(node.env(CUDA_DEVICE_SM_LIMIT=share, GPU_CORE_UTILIZATION_POLICY="force"), "init", "ctx", 0,
                "launchfor", "launch", 1500, 100)
    per_100ms = steps[2]["per_100ms"]
    settled = per_100ms[7:]  # after the controller's first steps
    achieved = sum(settled) / len(settled) / FULL_SPEED_PER_100MS
    assert abs(achieved - share / 100) < 0.1, per_100ms
    assert per_100ms[0] > 0.9 * FULL_SPEED_PER_100MS  # unmeasured at first: free


def test_the_fake_gpu_runs_at_full_speed_without_the_shim(node):
    steps = run(node.env(shim=False), "init", "ctx", 0, "launchfor", "launch", 500, 100)
    assert sum(steps[2]["per_100ms"]) / len(steps[2]["per_100ms"]) > 0.9 * FULL_SPEED_PER_100MS


def test_at_100_percent_nothing_is_throttled(node):
    steps = run(node.env(CUDA_DEVICE_SM_LIMIT=100), "init", "ctx", 0, "launch", 100, 1, "stats", 0)
    assert steps[3]["shim"] and not steps[3]["active"] and steps[3]["draws"] == 0


@pytest.mark.parametrize("policy,active", [("force", 1), ("default", 1), ("disable", 0), ("DISABLE", 0)])
def test_core_policy(node, policy, active):
    steps = run(node.env(CUDA_DEVICE_SM_LIMIT=20, GPU_CORE_UTILIZATION_POLICY=policy), "init", "ctx", 0, "stats", 0)
    assert steps[2]["active"] == active


@pytest.mark.parametrize("mode", ["gpa", "gpa-ptsz", "dlsym", "linked"])
@pytest.mark.parametrize("kind", ["launch", "launchex", "coop", "graph"])
def test_every_launch_path_reaches_its_own_entry_point_and_is_held_back(node, mode, kind):
    # The process keeps the fake GPU busy: at a 20 % share the gate must make launches wait.
    limits = contract.Limits(devices=(contract.DeviceLimit(node.uuid(0), 0, 20),
                                      contract.DeviceLimit(node.uuid(1), 0, 100)), core_policy="force")
    env = node.env(GPUSHARE_LIMITS_FILE=node.write_limits(limits))
    steps = run(env, "init", "ctx", 0, "launchfor", kind, 600, 100, "counters", "stats", 0, mode=mode)
    launched, counters, stats = steps[2], steps[3], steps[4]
    assert launched["rc"] == CUDA_SUCCESS
    entry = {"launch": "launch", "launchex": "launch_ex", "coop": "launch_coop", "graph": "graph_launch"}[kind]
    ptsz = mode == "gpa-ptsz"
    assert counters[entry + ("_ptsz" if ptsz else "")] == launched["n"]
    assert counters[entry + ("" if ptsz else "_ptsz")] == 0
    assert stats["active"] and stats["draws"] > 0 and stats["waits"] > 0


def test_throttling_follows_the_gpu_it_launches_on(node):
    limits = contract.Limits(devices=(contract.DeviceLimit(node.uuid(0), 0, 100),
                                      contract.DeviceLimit(node.uuid(1), 0, 30)), core_policy="force")
    env = node.env(GPUSHARE_LIMITS_FILE=node.write_limits(limits))
    free = run(env, "init", "ctx", 0, "launchfor", "launch", 600, 100)[2]["per_100ms"]
    held = run(env, "init", "ctx", 1, "launchfor", "launch", 1200, 100)[2]["per_100ms"]
    assert sum(free[2:]) / len(free[2:]) > 0.9 * FULL_SPEED_PER_100MS
    assert sum(held[7:]) / len(held[7:]) < 0.45 * FULL_SPEED_PER_100MS
