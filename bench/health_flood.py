"""What half-sent requests cost the node daemon: `devplugin serve` as a process (2 fake GPUs, cgpu) with its probes'
port and its metrics port, measured from /proc. First idle (RSS, CPU over --idle-seconds, probe latency); then
--connections connections from one address (one pod) that each send the start of a request and never the rest;
then the same number spread over --sources addresses (many pods). For each: the daemon's threads and RSS while
they are held, how many it kept open, what the kubelet's probe (another address, 1 s timeout) got, and how long
until the daemon closed the last of them. --source runs the daemon from another checkout's tree (e.g. an older
release unpacked with `git archive`), to compare.

Run: .venv/bin/python bench/health_flood.py [--connections 1000] [--sources 50] [--idle-seconds 10] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, gpus, percentile, workdir  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver  # noqa: E402
from devplugin_sim.kubelet import KubeletEmulator  # noqa: E402

HALF_SENT = b"GET /healthz HTTP/1.1\r\nHost: daemon\r\n"  # the blank line that ends the request never comes
COUNT = "aliyun.com/gpu-count"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe(port: int) -> tuple[int, float]:
    """(status, seconds) of one /healthz as the kubelet asks it (status 0: no answer within 1 s)."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1.0) as resp:
            code = int(resp.status)
    except urllib.error.HTTPError as err:
        code = int(err.code)
    except OSError:
        code = 0
    return code, time.perf_counter() - t0


def half_sent(sources: list[str], port: int, n: int) -> list[socket.socket]:
    held = []
    for i in range(n):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.bind((sources[i % len(sources)], 0))
            s.connect(("127.0.0.1", port))
            s.sendall(HALF_SENT)
        except OSError:
            s.close()
            continue
        held.append(s)
    return held


def open_ones(held: list[socket.socket]) -> list[socket.socket]:
    """Those the daemon has not closed."""
    out = []
    for s in held:
        try:
            s.settimeout(0)
            if s.recv(1024) == b"":
                continue
        except BlockingIOError:
            out.append(s)
            continue
        except OSError:
            continue
    return out


def flood(pid: int, port: int, sources: list[str], n: int, label: str) -> None:
    held = half_sent(sources, port, n)
    try:
        time.sleep(1.0)
        kept = open_ones(held)
        probes = [probe(port) for _ in range(10)]
        answered = [t for code, t in probes if code == 200]
        p50 = f"{percentile(answered, 50) * 1000:.1f} ms" if answered else "-"
        print(f"{label}: {n} half-sent requests from {len(sources)} address(es): the daemon kept {len(kept)} open; "
              f"threads {status(pid, 'Threads')}, RSS {status(pid, 'VmRSS') / 1024:.1f} MiB; probes answered "
              f"{len(answered)}/10 (p50 {p50})")
        t0 = time.monotonic()
        while kept and time.monotonic() - t0 < 30:
            time.sleep(0.1)
            kept = open_ones(kept)
        closed = f"{time.monotonic() - t0 + 1.0:.1f} s" if not kept else f"not within 31 s ({len(kept)} open)"
        print(f"{label}: all closed by the daemon after {closed}; then threads {status(pid, 'Threads')}, RSS "
              f"{status(pid, 'VmRSS') / 1024:.1f} MiB, probe {probe(port)[0]}")
    finally:
        for s in held:
            s.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--sources", type=int, default=50)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--source", type=Path, default=REPO, help="the tree whose devplugin runs (default: this one)")
    args = parser.parse_args()
    if args.connections < 1 or not 1 <= args.sources <= 250 or args.idle_seconds <= 0:
        parser.error("--connections >= 1, --sources 1..250 and --idle-seconds > 0")
    if not (args.source / "devplugin" / "__main__.py").is_file():
        parser.error(f"--source {args.source}: no devplugin package there")
    root = workdir()
    port = free_port()
    try:
        driver = FakeDriver.create(root / "drv", gpus(2, 16 * 1024))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            env = {**os.environ, **driver.env(), "PYTHONPATH": str(args.source)}
            extra = ("--metrics-port", str(free_port())) if "metrics_port" in (
                args.source / "devplugin" / "app" / "config.py").read_text() else ()
            proc = subprocess.Popen(
                [sys.executable, "-m", "devplugin", "serve", "--mode", "cgpu", "--node-name", "",
                 "--plugin-dir", str(root / "dp"), "--pod-resources-socket", str(root / "pr.sock"), "--shim", "off",
                 "--state-dir", str(root / "state"), "--shim-state-dir", str(root / "shim"), "--health-port",
                 str(port), "--log-level", "ERROR", *extra], env=env, cwd=str(root), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            try:
                if not kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 2, timeout=30):
                    print("health flood bench: the daemon did not register", file=sys.stderr)
                    return 1
                time.sleep(2.0)
                pid = proc.pid
                cpu0, t0 = cpu_seconds(pid), time.monotonic()
                time.sleep(args.idle_seconds)
                idle_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0) * 100
                lat = [probe(port)[1] for _ in range(50)]
                print(f"idle ({args.source}): threads {status(pid, 'Threads')}, RSS {status(pid, 'VmRSS') / 1024:.1f} "
                      f"MiB, CPU {idle_cpu:.2f} % of one core over {args.idle_seconds:g} s; probe p50 "
                      f"{percentile(lat, 50) * 1000:.2f} ms, p99 {percentile(lat, 99) * 1000:.2f} ms")
                flood(pid, port, ["127.0.0.2"], args.connections, "one pod")
                flood(pid, port, [f"127.0.1.{i + 1}" for i in range(args.sources)], args.connections, "many pods")
                print(f"daemon still running: {proc.poll() is None}; peak RSS (VmHWM) "
                      f"{status(pid, 'VmHWM') / 1024:.1f} MiB")
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
