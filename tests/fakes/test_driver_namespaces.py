"""The fake driver in containers: processes in PID namespaces of their own (pid 1 each) on one node's GPUs.

With `driver_socket=` the fake learns each process's host pid from the node (devplugin_sim/driver_socket.py), so
two containers' pid 1 are two processes to NVML and to the simulated GPU's timeline, and a killed one is found
dead by asking the node; a container's config lists only its GPUs (index 0..k-1), each at the node's state slot.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from devplugin_sim.driver_socket import DriverSocket
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, library_dir, seed_uuid
from tests.fakes import pid_namespaces
from tests.support.cuda_runtime import runtime_probe
from tests.support.shim_probe import TESTS, MiB, gpus, next_step, require_built, until

OFFSET = 100000
SIM = {"FAKE_CUDA_NS_PER_BLOCK": "1000", "FAKE_CUDA_QUEUE_US": "20000"}
PROBE = [sys.executable, str(Path(__file__).with_name("driver_probe.py"))]
_SCRUB = ("CUDA_", "GPUSHARE_", "GPU_CORE_", "FAKE_", "LD_PRELOAD", "GS_PROBE_")


@pytest.fixture
def node(make_driver: Callable[..., FakeDriver]) -> Iterator[FakeDriver]:
    """An 8-GPU node; this test process reads it through NVML as the host does."""
    require_built()
    pid_namespaces.require_pid_namespaces()
    driver = make_driver(gpus(8), host_pid_offset=OFFSET, sample_period_ms=50)
    pynvml.nvmlInit()
    yield driver
    pynvml.nvmlShutdown()


@pytest.fixture
def sock() -> Iterator[DriverSocket]:
    """The node's driver socket (a short path: unix socket paths have at most 107 characters)."""
    with tempfile.TemporaryDirectory(prefix="fkdrv", dir="/tmp") as d, DriverSocket(Path(d) / "driver.sock") as s:
        yield s


def container_env(config: Path, node: FakeDriver, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update(node.env())
    env["FAKE_NVML_CONFIG"] = str(config)
    env["GS_PROBE_LIBCUDA"] = str(library_dir() / "libcuda.so.1")
    env.update(settings)
    return env


def gs_probe(*steps: str | int) -> list[str]:
    """gs_probe (a driver-API program) behind a shell that first prints its pid: 1 in a fresh PID namespace."""
    return ["sh", "-c", 'echo "{\\"op\\":\\"pid\\",\\"pid\\":$$}"; exec "$0" "$@"', str(TESTS / "gs_probe"), "gpa",
            *map(str, steps)]


def finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=20)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=20)


def host_processes(gpu: int) -> list[int]:
    return sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(gpu)))


def test_two_containers_pid_1_are_two_processes_under_their_host_pids_sharing_the_timeline(
        node: FakeDriver, sock: DriverSocket, tmp_path: Path) -> None:
    config = node.write_container_config(tmp_path / "c.conf", [node.gpus[0].uuid], driver_socket=sock.path)
    env = container_env(config, node, **SIM)
    procs = [pid_namespaces.start(gs_probe("init", "ctx", 0, "ready", "launchfor", "launch", 1200, 1000, "ready"),
                                  env) for _ in range(2)]
    try:
        hosts = [pid_namespaces.host_pid(p) for p in procs]
        assert [next_step(p)["pid"] for p in procs] == [1, 1]
        for p in procs:
            until(p, "ready")
        assert host_processes(0) == sorted(hosts)  # two processes, each under its host pid (no offset)
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        time.sleep(0.4)
        before, t0 = {t.pid: t.busy_ns for t in node.process_times(0)}, time.monotonic()
        time.sleep(0.5)
        after, dt = node.process_times(0), time.monotonic() - t0
        got = {t.pid: (t.busy_ns - before[t.pid]) / dt / 1e9 for t in after}
        assert sorted(got) == sorted(hosts)
        assert all(0.4 <= share <= 0.6 for share in got.values()), got  # one timeline: each waits for the other
        assert {t.host_pid for t in after} == set(hosts)
        assert {(peer, line) for peer, line in sock.requests() if line == "pid"} == {(h, "pid") for h in hosts}
    finally:
        for p in procs:
            finish(p)


def test_a_killed_container_process_is_found_dead_through_the_socket_and_its_entry_freed(
        node: FakeDriver, sock: DriverSocket, tmp_path: Path) -> None:
    config = node.write_container_config(tmp_path / "c.conf", [node.gpus[0].uuid], driver_socket=sock.path)
    env = container_env(config, node)
    doomed, survivor = (pid_namespaces.start(gs_probe("init", "ctx", 0, "ready"), env) for _ in range(2))
    newcomer = None
    try:
        victim, kept = pid_namespaces.host_pid(doomed), pid_namespaces.host_pid(survivor)
        until(doomed, "ready")
        until(survivor, "ready")
        assert sorted(t.pid for t in node.process_times(0)) == sorted([victim, kept])
        os.kill(victim, 9)  # SIGKILL: no exit handler runs, its procs[] entry stays behind
        doomed.wait(timeout=20)
        assert sorted(t.pid for t in node.process_times(0)) == sorted([victim, kept])
        assert host_processes(0) == [kept]  # NVML lists only the living

        newcomer = pid_namespaces.start(gs_probe("init", "ctx", 0, "ready"), env)
        arrived = pid_namespaces.host_pid(newcomer)
        until(newcomer, "ready")
        assert sorted(t.pid for t in node.process_times(0)) == sorted([kept, arrived])  # the dead entry is freed
        assert (arrived, f"alive {victim}") in sock.requests()  # the node was asked, not kill() in the namespace

        seen = subprocess.run(pid_namespaces.UNSHARE + [*PROBE, "nvmlprocs", "0"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert seen.returncode == 0, seen.stderr
        assert next_line(seen.stdout, "nvmlprocs")["pids"] == sorted([kept, arrived])
    finally:
        kill(doomed)
        finish(survivor)
        if newcomer:
            finish(newcomer)



def test_a_forked_child_in_a_container_asks_for_its_own_host_pid(
        node: FakeDriver, sock: DriverSocket, tmp_path: Path) -> None:
    config = node.write_container_config(tmp_path / "c.conf", [node.gpus[4].uuid], driver_socket=sock.path)
    probe = pid_namespaces.start([*PROBE, "pid", "alloc", "0", "64", "forkalloc", "0", "128", "ready"],
                                 container_env(config, node))
    try:
        parent = pid_namespaces.host_pid(probe)
        steps = until(probe, "ready")
        while not any(s["op"] == "forkalloc" for s in steps):  # the child prints when it is done, in any order
            steps.append(next_step(probe))
        child = next(s for s in steps if s["op"] == "forkalloc")
        assert steps[0]["pid"] == 1 and child["pid"] == 2 and child["rc"] == 0
        child_host = int(Path(f"/proc/{parent}/task/{parent}/children").read_text().split()[0])
        times = {t.pid: t.host_pid for t in node.process_times(4)}
        assert times == {parent: parent, child_host: child_host}  # two processes, not the parent's pid twice
        assert node.memory_used(4) == 192 * MiB
    finally:
        finish(probe)

def test_a_timeline_lock_held_by_a_live_process_outside_the_namespace_is_waited_for(
        node: FakeDriver, sock: DriverSocket, tmp_path: Path) -> None:
    config = node.write_container_config(tmp_path / "c.conf", [node.gpus[3].uuid], driver_socket=sock.path)
    holder = subprocess.Popen(["sleep", "60"])  # a host process the container cannot see
    probe = pid_namespaces.start(gs_probe("init", "ctx", 0, "ready", "launch", 1, 10, "ready"),
                                 container_env(config, node, **SIM))
    try:
        until(probe, "ready")
        node.set_timeline_lock(3, holder.pid)  # as if it held GPU 3's timeline (the container's GPU 0)
        probe.stdin.write("\n")
        probe.stdin.flush()
        waiting, _, _ = select.select([probe.stdout], [], [], 1.0)
        assert not waiting, "the launch took a lock whose holder is alive on the host"
        assert any(line == f"alive {holder.pid}" for _, line in sock.requests())
        holder.kill()
        holder.wait()
        assert next_step(probe)["op"] == "launch"  # the holder is gone: the lock is taken over
    finally:
        kill(holder)
        finish(probe)


def next_line(stdout: str, op: str) -> dict:
    return next(json.loads(line) for line in stdout.splitlines() if line.startswith("{") and f'"{op}"' in line)


def probe_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_a_container_granted_gpus_2_and_5_sees_two_gpus_at_the_nodes_slots(
        node: FakeDriver, sock: DriverSocket, tmp_path: Path) -> None:
    granted = [node.gpus[2].uuid, node.gpus[5].uuid]
    config = node.write_container_config(tmp_path / "c.conf", granted, driver_socket=sock.path)
    env = container_env(config, node)
    host_env = container_env(node.config_path, node)
    host = subprocess.Popen([str(TESTS / "gs_probe"), "gpa", "init", "ctx", "2", "alloc", "512m", "ready"],
                            env=host_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    inside = None
    try:
        until(host, "ready")  # a host process holds 512 MiB of GPU 2
        inside = pid_namespaces.start([*PROBE, "pid", "nvml", "cuda", "alloc", "0", "256", "nvml", "ready"], env)
        in_host_pid = pid_namespaces.host_pid(inside)
        steps = []
        while not steps or steps[-1]["op"] != "ready":
            steps.append(next_step(inside))
        pid, before, cuda, alloc, after = steps[:5]
        assert pid["pid"] == 1
        assert before["count"] == 2
        assert [(g["index"], g["uuid"]) for g in before["gpus"]] == [(0, granted[0]), (1, granted[1])]
        assert [g["used"] for g in before["gpus"]] == [512 * MiB, 0]  # the node's GPU 2, not line 0's slot
        assert (cuda["count"], cuda["uuids"]) == (2, granted)
        assert alloc["rc"] == 0
        assert [g["used"] for g in after["gpus"]] == [768 * MiB, 0]

        used = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used for i in range(8)]
        assert used == [0, 0, 768 * MiB, 0, 0, 0, 0, 0]  # the host sees the container's 256 MiB on GPU 2
        assert host_processes(2) == sorted([host.pid + OFFSET, in_host_pid])
        assert host_processes(0) == []

        smi = library_dir() / "nvidia-smi"
        query = subprocess.run(pid_namespaces.UNSHARE + [str(smi), "--query-gpu=index,uuid,memory.used",
                                                         "--format=csv,noheader"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert query.returncode == 0, query.stdout + query.stderr
        assert query.stdout.splitlines() == [f"0, {granted[0]}, 768 MiB", f"1, {granted[1]}, 0 MiB"]
        listed = subprocess.run(pid_namespaces.UNSHARE + [str(smi), "-L"], env=env, capture_output=True, text=True,
                                timeout=60)
        assert [line.split("UUID: ")[1].rstrip(")") for line in listed.stdout.splitlines()] == granted
    finally:
        finish(host)
        if inside:
            finish(inside)


def test_cuda_visible_devices_picks_among_the_containers_gpus(
        node: FakeDriver, sock: DriverSocket, tmp_path: Path) -> None:
    granted = [node.gpus[2].uuid, node.gpus[5].uuid]
    config = node.write_container_config(tmp_path / "c.conf", granted, driver_socket=sock.path)
    probe = pid_namespaces.start([*PROBE, "cuda", "alloc", "0", "128", "ready"],
                                 container_env(config, node, CUDA_VISIBLE_DEVICES="1"))
    try:
        cuda, alloc, _ = until(probe, "ready")
        assert (cuda["count"], cuda["uuids"]) == (1, [granted[1]])  # index 1 of the container = the node's GPU 5
        assert alloc["rc"] == 0
        used = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used for i in range(8)]
        assert used == [0, 0, 0, 0, 0, 128 * MiB, 0, 0]
    finally:
        finish(probe)
    assert pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(5)).used == 0  # given back at exit


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_nvidias_runtime_in_a_container_sees_its_gpus_and_charges_the_nodes(
        make_driver: Callable[..., FakeDriver], sock: DriverSocket, tmp_path: Path, cudart: str) -> None:
    require_built()
    pid_namespaces.require_pid_namespaces()
    program = runtime_probe(cudart)
    a100s = [FakeGPU(index=i, uuid=seed_uuid(i, "a100s"), name="NVIDIA A100-SXM4-40GB", memory_mib=40960, minor=i,
                     pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", sms=108, compute_capability=(8, 0))
             for i in range(8)]
    node = make_driver(a100s)
    config = node.write_container_config(tmp_path / "c.conf", [a100s[2].uuid, a100s[5].uuid],
                                         driver_socket=sock.path)
    probe = pid_namespaces.start([str(program), "init", "props", "alloc", "256", "nvml", "ready"],
                                 container_env(config, node))
    try:
        init, props, alloc, nvml, _ = until(probe, "ready")
        assert init["rc"] == 0 and alloc["rc"] == 0, probe.stderr.read() if probe.poll() is not None else init
        assert (props["name"], props["sms"], props["total"]) == ("NVIDIA A100-SXM4-40GB", 108, 40960 * MiB)
        assert nvml["used"] == 256 * MiB  # the runtime's NVML view of its device 0
        assert [node.memory_used(i) for i in range(8)] == [0, 0, 256 * MiB, 0, 0, 0, 0, 0]
        assert [t.pid for t in node.process_times(2)] == [pid_namespaces.host_pid(probe)]
    finally:
        finish(probe)
