"""Half-sent requests to the node daemon's health port cost it no thread and no unbounded memory, and the kubelet's
probes are still answered: `devplugin serve` as a process, measured from /proc while connections that never finish
their request are held open from one address (one pod) and from many (many pods), and each is closed by the daemon
once its deadline passes. The kubelet probes from another address (its node's), as it does in a cluster, and is
answered all along."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from tests.app.test_serve_process import serve
from tests.support.daemon_harness import COUNT, _until, short_dir

HALF_SENT = b"GET /healthz HTTP/1.1\r\nHost: daemon\r\n"  # the blank line that ends the request never comes
PROBE_TIMEOUT_S = 1.0  # the kubelet's default timeoutSeconds
# How long the daemon gives a connection to send a whole request (devplugin/app/http_serving.py), and the time
# the test allows on top for a loaded machine.
REQUEST_DEADLINE_S = 5.0
SLACK_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {key}")


def probe(port: int, path: str) -> int:
    """The status the kubelet's probe gets (0: no answer within its timeout)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=PROBE_TIMEOUT_S) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def half_sent(source: str, port: int, n: int) -> list[socket.socket]:
    """`n` connections from `source` that each send the start of a request and never the rest."""
    held = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(2)
        try:
            s.bind((source, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(HALF_SENT)
        except OSError:  # refused or closed by the daemon at once: what a bounded server may do
            s.close()
            continue
        held.append(s)
    return held


def closed_by_peer(s: socket.socket) -> bool:
    try:
        s.settimeout(0)
        return s.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


@dataclass
class Daemon:
    proc: subprocess.Popen
    port: int


@contextmanager
def daemon() -> Iterator[Daemon]:
    root = short_dir()
    port = free_port()
    try:
        driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            proc = serve(driver, root, "--mode", "cgpu", "--node-name", "", "--health-port", str(port))
            try:
                assert kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 2, timeout=20)
                assert _until(lambda: probe(port, "/readyz") == 200, 10)
                yield Daemon(proc, port)
            finally:
                proc.send_signal(signal.SIGTERM)
                out, _ = proc.communicate(timeout=15)
            assert proc.returncode == 0, out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_half_sent_requests_from_a_pod_hold_no_thread_and_the_probes_are_answered() -> None:
    with daemon() as d:
        threads = proc_status(d.proc.pid, "Threads")
        # The deadline of every connection runs from its own connect, which is after this moment: the ones the
        # daemon admits (the first few; the rest from this address are closed at once) are closed no earlier than
        # the deadline after it, however long opening the others and probing took on a loaded machine.
        opened = time.monotonic()
        held = half_sent("127.0.0.2", d.port, 300)
        try:
            time.sleep(0.5)
            assert proc_status(d.proc.pid, "Threads") <= threads + 2, "a half-sent request holds a thread"
            assert (probe(d.port, "/healthz"), probe(d.port, "/readyz")) == (200, 200)
            assert _until(lambda: all(closed_by_peer(s) for s in held), REQUEST_DEADLINE_S + SLACK_S), \
                "the daemon keeps half-sent requests open past their deadline"
            assert time.monotonic() - opened >= REQUEST_DEADLINE_S - 0.5, "closed before the deadline"
        finally:
            for s in held:
                s.close()
        assert (probe(d.port, "/healthz"), probe(d.port, "/readyz")) == (200, 200)


def test_a_flood_from_many_pods_stays_within_the_daemons_memory_and_it_recovers() -> None:
    with daemon() as d:
        threads, rss = proc_status(d.proc.pid, "Threads"), proc_status(d.proc.pid, "VmRSS")
        held: list[socket.socket] = []
        try:
            for i in range(25):  # 25 pods, 40 connections each
                held += half_sent(f"127.0.1.{i + 1}", d.port, 40)
            time.sleep(0.5)
            assert d.proc.poll() is None
            assert proc_status(d.proc.pid, "Threads") <= threads + 2
            grown_mib = (proc_status(d.proc.pid, "VmRSS") - rss) / 1024
            assert grown_mib < 16, f"RSS grew {grown_mib:.1f} MiB under 1000 half-sent requests"
            # the probes get in: each takes the place of the oldest connection still waiting for its request
            assert [probe(d.port, "/healthz") for _ in range(5)] == [200] * 5
            assert probe(d.port, "/readyz") == 200
        finally:
            for s in held:
                s.close()
        assert (probe(d.port, "/healthz"), probe(d.port, "/readyz")) == (200, 200)
