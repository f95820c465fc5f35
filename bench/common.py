"""Shared setup for the benchmarks: a fake node, the kubelet emulator, and `devplugin serve` as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from devplugin_sim.fake_driver import FakeDriver, FakeGPU

REPO = Path(__file__).resolve().parents[1]
DOMAIN = "aliyun.com"
MEM, CORE, COUNT = f"{DOMAIN}/gpu-mem", f"{DOMAIN}/gpu-core.percentage", f"{DOMAIN}/gpu-count"


def gpus(n: int, mib: int, name: str = "NVIDIA H100 80GB HBM3") -> list[FakeGPU]:
    return [FakeGPU(index=i, uuid=f"GPU-{i:08x}-bench-0000-0000-{i:012x}", name=name, memory_mib=mib, minor=i,
                    pci_bus_id=f"00000000:{i + 1:02x}:00.0", numa_node=i // 4, sms=132) for i in range(n)]


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="gsbench-", dir="/tmp"))


def start_daemon(driver: FakeDriver, root: Path, *args: str, node_name: str = "", kubeconfig: str = "",
                 log_level: str = "WARNING") -> subprocess.Popen:
    """`devplugin serve` on the fake node; its state, health and shim directories under `root` (nothing under
    /var/lib or /var/run, no health port). With `node_name` and `kubeconfig` it links to that apiserver."""
    env = {**os.environ, **driver.env(), "PYTHONPATH": str(REPO)}
    env.pop("NODE_NAME", None)
    cmd = [sys.executable, "-m", "devplugin", "serve", "--mode", "core_mem", "--node-name", node_name,
           "--kubeconfig", kubeconfig, "--plugin-dir", str(root / "dp"),
           "--pod-resources-socket", str(root / "pr.sock"), "--shim", "off", "--state-dir", str(root / "state"),
           "--shim-state-dir", str(root / "shim"), "--health-port", "0", "--log-level", log_level, *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]
