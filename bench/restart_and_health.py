"""Kubelet restart to all three resources registered again; XID event to Unhealthy in ListAndWatch; the daemon's
steady RSS and idle CPU. Runs `devplugin serve` as a process against the kubelet emulator and the fake driver.

Run: .venv/bin/python bench/restart_and_health.py [--rounds 10] [--idle-seconds 10]
Targets: restart -> registered <= 1 s; XID -> Unhealthy <= 1 s; RSS <= 80 MB; idle CPU near zero.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import CORE, COUNT, MEM, gpus, percentile, start_daemon, stop, workdir  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver  # noqa: E402
from devplugin_sim.kubelet import KubeletEmulator  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    args = parser.parse_args()
    root = workdir()
    full = {MEM: 640, CORE: 800, COUNT: 8}
    try:
        driver = FakeDriver.create(root / "drv", gpus(8, 80 * 1024))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            daemon = start_daemon(driver, root, "--recovery-seconds", "0.2")
            if not kubelet.wait_for(lambda k: k.allocatable() == full, timeout=30):
                print("daemon did not register", file=sys.stderr)
                return 1
            restarts = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                kubelet.restart()
                assert kubelet.wait_for(lambda k: k.allocatable() == full, timeout=10), "no re-registration"
                restarts.append(time.perf_counter() - t0)
            xids = []
            for i in range(args.rounds):
                gpu = i % 8
                t0 = time.perf_counter()
                driver.raise_xid(gpu, 79)
                assert kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 560, timeout=10), "no Unhealthy"
                xids.append(time.perf_counter() - t0)
                assert kubelet.wait_for(lambda k: k.allocatable() == full, timeout=10), "no recovery"
            time.sleep(1.0)
            c0 = cpu_seconds(daemon.pid)
            time.sleep(args.idle_seconds)
            idle = (cpu_seconds(daemon.pid) - c0) / args.idle_seconds * 100
            rss = rss_mb(daemon.pid)
            stop(daemon)
        print("node: 8 x 80 GiB, core_mem; daemon as a process")
        print(f"kubelet restart -> 3 resources registered again: p50 {percentile(restarts, 50) * 1000:.0f} ms, "
              f"max {max(restarts) * 1000:.0f} ms over {len(restarts)} restarts")
        print(f"XID 79 -> devices Unhealthy at the kubelet: p50 {percentile(xids, 50) * 1000:.0f} ms, "
              f"max {max(xids) * 1000:.0f} ms over {len(xids)} events")
        print(f"steady RSS: {rss:.1f} MB; idle CPU over {args.idle_seconds:.0f} s: {idle:.2f} % of one core")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
