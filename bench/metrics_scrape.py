"""The cost of the node daemon's /metrics with per-container use: `devplugin serve` as a process on an 8-GPU node
(8 x 80 GiB, core_mem, the shim delivered), 110 containers admitted through the kubelet emulator (110 is the
kubelet's default pod limit), each with a usage file as its shim writes it (1 to 3 processes, memory held,
refusals, throttled time, compute measured). Prints the time one scrape takes, client-measured over HTTP, and
admission latency (GetPreferredAllocation + Allocate for gpu-mem and gpu-core.percentage through the kubelet
emulator) in the same run: alone, while another process scrapes /metrics once a second (Prometheus scrapes
every 15 to 60 s: this is many times that), and while it scrapes back to back (the worst case: the daemon
does nothing but answer scrapes between admissions).

Run: .venv/bin/python bench/metrics_scrape.py [--containers 110] [--scrapes 200] [--admissions 300]
Target: a scrape under 50 ms; admission latency while scraping within noise of the figure without.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import CORE, MEM, REPO, gpus, percentile, start_daemon, stop, workdir  # noqa: E402
from devplugin import contract as c  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver  # noqa: E402
from devplugin_sim.kubelet import AdmissionError, KubeletEmulator  # noqa: E402
from devplugin_sim.pods import ContainerSpec, PodSpec  # noqa: E402

SHIM_LIB = REPO / "build" / "shim" / "libgpushare.so"  # only its existence matters: --shim on
GiB = 1 << 30
SCRAPER = """
import sys, time, urllib.request
url, pause = sys.argv[1], float(sys.argv[2])
while True:
    urllib.request.urlopen(url, timeout=10).read()
    time.sleep(pause)
"""


def usage_file(uuid: str, used: list[int], refused: int, throttled_ns: int, used_pct: int) -> bytes:
    """A usage file as the shim lays it out (contract.USAGE_*): one GPU, one slot per process."""
    buf = bytearray(c.USAGE_FILE_SIZE)
    struct.pack_into("<QIII", buf, 0, c.USAGE_MAGIC, c.USAGE_VERSION, 1, len(used))
    buf[c.USAGE_OFF_DEVICES:c.USAGE_OFF_DEVICES + len(uuid)] = uuid.encode()
    for i, u in enumerate(used):
        off = c.USAGE_OFF_SLOTS + i * c.USAGE_SLOT_SIZE
        struct.pack_into("<i", buf, off, 1000 + i)
        struct.pack_into("<Q", buf, off + c.USAGE_SLOT_USED, u)
    struct.pack_into("<i", buf, c.USAGE_OFF_COMPUTE + c.USAGE_COMPUTE_USED_PCT, used_pct)
    struct.pack_into("<i", buf, c.USAGE_OFF_COMPUTE + c.USAGE_COMPUTE_STEPS, 10)
    struct.pack_into("<QQQ", buf, c.USAGE_OFF_STATS, refused, refused * GiB, throttled_ns)
    return bytes(buf)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return (time.perf_counter() - t0) * 1000, text


def admissions(kubelet: KubeletEmulator, n: int, rng: random.Random) -> tuple[list[float], int]:
    """Admit and remove n one-container pods: each successful admission's time in ms, and how many were refused
    (the kubelet emulator says why on stderr)."""
    times, refused = [], 0
    for i in range(n):
        pod = PodSpec(name=f"probe-{i}", containers=[ContainerSpec(
            name="main", limits={MEM: rng.randint(1, 4), CORE: rng.choice((5, 10))})])
        t0 = time.perf_counter()
        try:
            kubelet.admit(pod)
            times.append((time.perf_counter() - t0) * 1000)
        except AdmissionError as exc:
            refused += 1
            print(f"note: admission refused: {exc}", file=sys.stderr)
        kubelet.remove_pod(pod.uid)
    return times, refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containers", type=int, default=110)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--admissions", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if min(args.containers, args.scrapes, args.admissions) < 1:
        parser.error("--containers, --scrapes and --admissions must be at least 1")
    if not SHIM_LIB.exists():
        print(f"metrics bench: {SHIM_LIB} is missing: run `make native`", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    root = workdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        driver = FakeDriver.create(root / "drv", gpus(8, 80 * 1024))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            daemon = start_daemon(driver, root, "--shim", "on", "--shim-lib", str(SHIM_LIB),
                                  "--metrics-port", str(port))
            try:
                if not kubelet.wait_for(lambda k: k.allocatable().get(CORE, 0) == 800, timeout=30):
                    print("metrics bench: the daemon did not register", file=sys.stderr)
                    return 1
                for i in range(args.containers):
                    got = kubelet.admit(PodSpec(name=f"c{i}", containers=[ContainerSpec(
                        name="main", limits={MEM: rng.randint(1, 4), CORE: 5})]))
                    ctr = got.containers[0]
                    cache = next(m.host_path for m in ctr.mounts if m.container_path == c.CONTAINER_SHARED_CACHE)
                    uuid = ctr.envs[c.ENV_NVIDIA_VISIBLE_DEVICES]
                    procs = [rng.randint(1, 512) << 20 for _ in range(rng.randint(1, 3))]
                    Path(cache).write_bytes(usage_file(
                        uuid, procs, rng.randint(0, 5), rng.randint(0, 10**10), rng.randint(0, 30)))
                _, text = scrape(url)
                series = text.count("gpushare_container_memory_used_bytes{")
                if series != args.containers:
                    print(f"metrics bench: /metrics shows {series} containers, not {args.containers}",
                          file=sys.stderr)
                    return 1
                for _ in range(10):
                    scrape(url)
                cpu0 = cpu_seconds(daemon.pid)
                times = [scrape(url)[0] for _ in range(args.scrapes)]
                cpu_ms = (cpu_seconds(daemon.pid) - cpu0) * 1000 / args.scrapes
                size = len(text.encode())
                admissions(kubelet, 20, rng)  # warm up
                phases: list[tuple[str, tuple[list[float], int]]] = [
                    ("alone", admissions(kubelet, args.admissions, rng))]
                for name, pause in (("while scraping once a second", "1"), ("while scraping back to back", "0")):
                    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, url, pause],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    try:
                        time.sleep(0.5)
                        phases.append((name, admissions(kubelet, args.admissions, rng)))
                    finally:
                        scraper.kill()
                        scraper.wait()
            finally:
                stop(daemon)
        print(f"/metrics with {args.containers} containers on 8 GPUs ({series} per-container series of each "
              f"metric, {size} bytes): scrape p50 {percentile(times, 50):.1f} ms, p99 {percentile(times, 99):.1f} ms, "
              f"max {max(times):.1f} ms ({args.scrapes} scrapes, client-measured over HTTP); the daemon's CPU per "
              f"scrape: {cpu_ms:.1f} ms")
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times stretch "
              "with it; the CPU time does not)")
        for name, (values, refused) in phases:
            print(f"admission latency {name}: p50 {percentile(values, 50):.3f} ms, p99 {percentile(values, 99):.3f} "
                  f"ms ({len(values)} admissions through the kubelet emulator" +
                  (f", {refused} refused" if refused else "") + ")")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
