"""Kubelet restart to all three resources registered again; a transient XID (8) to Unhealthy in ListAndWatch and
back to Healthy after the recovery window; an XID that needs a GPU reset (79) staying Unhealthy; the daemon's
steady RSS and idle CPU. Runs `devplugin serve` as a process against the kubelet emulator and the fake driver,
its state directory in a temporary folder and no health port.

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

TRANSIENT_XID = 8  # recovers after --recovery-seconds
RESET_XID = 79  # "GPU has fallen off the bus": Unhealthy until the GPU is reset
RECOVERY_S = 0.2
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
            daemon = start_daemon(driver, root, "--recovery-seconds", str(RECOVERY_S))
            if not kubelet.wait_for(lambda k: k.allocatable() == full, timeout=30):
                print("daemon did not register", file=sys.stderr)
                return 1
            restarts = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                kubelet.restart()
                assert kubelet.wait_for(lambda k: k.allocatable() == full, timeout=10), "no re-registration"
                restarts.append(time.perf_counter() - t0)
            xids, recoveries = [], []
            for i in range(args.rounds):
                gpu = i % 8
                t0 = time.perf_counter()
                driver.raise_xid(gpu, TRANSIENT_XID)
                assert kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 560, timeout=10), "no Unhealthy"
                t1 = time.perf_counter()
                xids.append(t1 - t0)
                assert kubelet.wait_for(lambda k: k.allocatable() == full, timeout=10), "no recovery"
                recoveries.append(time.perf_counter() - t1)
            driver.raise_xid(0, RESET_XID)
            assert kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 560, timeout=10), "no Unhealthy"
            held_s = 10 * RECOVERY_S
            time.sleep(held_s)
            still_down = kubelet.allocatable().get(MEM) == 560
            time.sleep(1.0)
            c0 = cpu_seconds(daemon.pid)
            time.sleep(args.idle_seconds)
            idle = (cpu_seconds(daemon.pid) - c0) / args.idle_seconds * 100
            rss = rss_mb(daemon.pid)
            stop(daemon)
        print("node: 8 x 80 GiB, core_mem; daemon as a process")
        print(f"kubelet restart -> 3 resources registered again: p50 {percentile(restarts, 50) * 1000:.0f} ms, "
              f"max {max(restarts) * 1000:.0f} ms over {len(restarts)} restarts")
        print(f"XID {TRANSIENT_XID} -> devices Unhealthy at the kubelet: p50 {percentile(xids, 50) * 1000:.0f} ms, "
              f"max {max(xids) * 1000:.0f} ms over {len(xids)} events")
        print(f"XID {TRANSIENT_XID}: Unhealthy -> Healthy again (--recovery-seconds {RECOVERY_S}): p50 "
              f"{percentile(recoveries, 50) * 1000:.0f} ms, max {max(recoveries) * 1000:.0f} ms")
        print(f"XID {RESET_XID} (needs a GPU reset): " + (
            f"still Unhealthy {held_s:.0f} s later, {held_s / RECOVERY_S:.0f} recovery windows, as designed"
            if still_down else "came back Healthy without a reset: WRONG"))
        print(f"steady RSS: {rss:.1f} MB; idle CPU over {args.idle_seconds:.0f} s: {idle:.2f} % of one core")
        return 0 if still_down else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
