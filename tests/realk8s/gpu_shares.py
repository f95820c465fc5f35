"""Compute shares of running pods' containers, measured on their node's fake GPU timeline.

Each container named runs NVIDIA's CUDA runtime probe (tests/cuda/rt_probe.cu, `launchfor`: kernels back to back)
through `kubectl exec`, all at the same time, under whatever its node gave it (the shim preloaded, its limits file).
The fake driver times a kernel only with FAKE_CUDA_NS_PER_BLOCK in the process's env, which the node agents pass
into GPU containers (tests/realk8s/node_runtime.py); the exec sets the same values too. What each container got is
read from the node's GPU timeline (`FakeDriver.process_times`: the GPU time of each process, under its host pid),
not from the shim: each process is told apart by a token in its env, read from /proc of the host.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.realk8s.cluster import Cluster
from tests.realk8s.images import TOOLS_IN_IMAGE

NS_PER_BLOCK = 1000  # 1 us per block: a launch of GRID blocks is 1 ms of GPU time
GRID = 1000
QUEUE_US = 20000  # work a process may have queued before a launch blocks
TOKEN = "GPUSHARE_TEST_SPINNER"
IDLE_BELOW = 90.0  # a GPU busy less than this (percent) over a window: its processes were short of CPU, not GPU


@dataclass(frozen=True)
class Spinner:
    """One container to keep busy: its pod, the node and the GPU (the node's index) its kernels run on."""

    ns: str
    pod: str
    container: str
    node: str
    gpu: int

    @property
    def name(self) -> str:
        return f"{self.pod}/{self.container}"


@dataclass
class Shares:
    """Each container's share of its GPU (percent) over the window, and each GPU's busy share."""

    per_container: dict[str, float]
    per_gpu: dict[tuple[str, int], float]
    windows: int  # windows measured (more than one when a GPU stood idle for want of CPU)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # each exec's result


def _token_of(pid: int) -> str:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    prefix = f"{TOKEN}=".encode()
    return next((e[len(prefix):].decode() for e in env if e.startswith(prefix)), "")


def measure(cluster: Cluster, spinners: list[Spinner], settle: float = 2.0, window: float = 2.0,
            start_timeout: float = 20.0, tries: int = 3) -> Shares:
    """Start every spinner's kernels at once; once all run, let the shares settle, then measure one window (again,
    up to `tries` windows, while a GPU stood idle: its processes lacked CPU on a loaded machine). The spinners are
    ended (SIGTERM, by their host pids) once measured."""
    seconds = start_timeout + settle + tries * window + 5  # the longest they may be needed
    runs: dict[str, dict[str, Any]] = {}

    def spin(s: Spinner) -> None:
        runs[s.name] = cluster.exec(s.ns, s.pod, s.container, [
            "env", f"{TOKEN}={s.name}", f"FAKE_CUDA_NS_PER_BLOCK={NS_PER_BLOCK}", f"FAKE_CUDA_QUEUE_US={QUEUE_US}",
            f"{TOOLS_IN_IMAGE}/rt_probe_static", "init", "launchfor", str(int(seconds * 1000)), str(GRID)],
            timeout=seconds + 60)

    gpus = sorted({(s.node, s.gpu) for s in spinners})
    names = {s.name for s in spinners}
    pids: dict[str, int] = {}

    def busy() -> dict[str, int]:
        out: dict[str, int] = {}
        for node, gpu in gpus:
            for pt in cluster.node(node).driver.process_times(gpu):
                name = _token_of(pt.host_pid)
                if name in names:
                    out[name] = out.get(name, 0) + pt.busy_ns
                    pids[name] = pt.host_pid
        return out

    threads = [threading.Thread(target=spin, args=(s,), name=f"spin-{s.name}") for s in spinners]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + start_timeout
        while set(busy()) != names:
            if time.monotonic() > deadline or not all(t.is_alive() for t in threads):
                raise AssertionError(f"not every container's kernels ran on the GPU within {start_timeout:.0f} s: "
                                     f"running {sorted(busy())} of {sorted(names)}; execs: {runs}")
            time.sleep(0.1)
        time.sleep(settle)
        windows = 0
        while True:
            windows += 1
            t0, before = time.monotonic(), busy()
            time.sleep(window)
            after, dt = busy(), time.monotonic() - t0
            per = {name: 100.0 * (after.get(name, 0) - before.get(name, 0)) / (dt * 1e9) for name in names}
            per_gpu = {g: sum(per[s.name] for s in spinners if (s.node, s.gpu) == g) for g in gpus}
            if windows == tries or all(v >= IDLE_BELOW for v in per_gpu.values()):
                break
        got = Shares(per, per_gpu, windows, runs)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for t in threads:
            t.join(seconds + 90)
    # each ran kernels until the end (exit 0) or until ended here (SIGTERM: 128 + 15)
    bad = {name: r for name, r in runs.items() if r.get("exitCode") not in (0, 128 + signal.SIGTERM)
           or r.get("error") or '"rc":0' not in r.get("stdout", "")}
    if bad:
        raise AssertionError(f"the kernels of {sorted(bad)} failed: {json.dumps(bad)[:3000]}")
    return got
