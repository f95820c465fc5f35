"""Extender failover: two `devplugin scheduler` replicas with leader election on a Lease (a fake apiserver holds
the Lease, one GPU node and the pods); the leader is killed (SIGKILL: no release) or stopped (SIGTERM: it
releases the Lease), and a client that calls every replica, as kube-scheduler does through the Service once
readiness moves, times kill -> the next successful bind (filter, then bind, over mutual TLS). The killed replica
is started again as the next round's follower. Prints each round and the median and worst.

The figures exclude what a real cluster adds after the new leader is ready: the readiness probe's period (1 s in
deploy/scheduler/deployment.yaml) and the endpoints update.

Run: .venv/bin/python bench/failover.py [--rounds 5] [--lease 3] [--renew-deadline 2] [--retry 0.5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench.common import REPO, percentile  # noqa: E402
from devplugin_sim.fake_apiserver import FakeApiserver  # noqa: E402
from tests.scheduler.tls_certs import make_ca, make_leaf  # noqa: E402
from tests.support.scheduler_objects import node  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, name: str, api: FakeApiserver, certs: dict[str, Path], args: argparse.Namespace) -> None:
        self.name, self.port = name, free_port()
        self.url = f"https://localhost:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devplugin", "scheduler", "--address", "127.0.0.1", "--port", str(self.port),
             "--tls-cert-file", str(certs["cert"]), "--tls-private-key-file", str(certs["key"]),
             "--client-ca-file", str(certs["ca"]), "--kubeconfig", api.kubeconfig_path, "--leader-elect",
             "--leader-elect-identity", name, "--leader-elect-lease", str(args.lease),
             "--leader-elect-renew-deadline", str(args.renew_deadline), "--leader-elect-retry", str(args.retry),
             "--log-level", "WARNING"],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready(self, http: httpx.Client) -> bool:
        return self.readyz(http) == "ok"

    def readyz(self, http: httpx.Client) -> str:
        """'ok' (leading), 'not the leader ...' (a synced follower), else why not (or 'down')."""
        try:
            return http.get(f"{self.url}/readyz", timeout=0.5).text
        except httpx.TransportError:
            return "down"


LAST: list[str] = [""]  # the last refusal, for the error when nothing binds


def bind_once(http: httpx.Client, replicas: list[Replica], api: FakeApiserver, i: int) -> bool:
    """Filter and bind a fresh pod through whichever replica answers (the Service's ready endpoint)."""
    pod = api.add_pod(name=f"f{i}", limits={"aliyun.com/gpu-mem": 1})
    for r in replicas:
        if r.proc.poll() is not None:
            continue
        try:
            f = http.post(f"{r.url}/scheduler/filter", json={"Pod": pod, "NodeNames": ["n1"]}, timeout=1)
            if f.status_code != 200 or f.json().get("NodeNames") != ["n1"]:
                LAST[0] += f" | {r.name} filter: {f.status_code} {f.text[:300]}"
                continue
            b = http.post(f"{r.url}/scheduler/bind", json={"PodName": f"f{i}", "PodNamespace": "default",
                                                          "PodUID": pod["metadata"]["uid"], "Node": "n1"}, timeout=2)
            if b.status_code == 200 and b.json().get("Error") == "":
                return True
            LAST[0] += f" | {r.name} bind: {b.status_code} {b.text[:300]}"
        except httpx.TransportError as exc:
            LAST[0] += f" | {r.name}: {exc!r}"
            continue
    api.delete_pod("default", f"f{i}")
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lease", type=float, default=3.0)
    ap.add_argument("--renew-deadline", type=float, default=2.0)
    ap.add_argument("--retry", type=float, default=0.5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gsbench-failover-"))
    ca = make_ca(tmp, "ca")
    cert, key = make_leaf(tmp, ca, "localhost", "serverAuth", ("localhost",))
    client = make_leaf(tmp, ca, "kube-scheduler", "clientAuth")
    certs = {"ca": ca[0], "cert": cert, "key": key}
    results: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
    ctx = ssl.create_default_context(cafile=str(ca[0]))
    ctx.load_cert_chain(str(client[0]), str(client[1]))  # kube-scheduler's client certificate
    with FakeApiserver() as api, httpx.Client(verify=ctx) as http:
        n = node("n1", gpus=8, units=80)
        api.add_node("n1", labels=n["metadata"]["labels"], annotations=n["metadata"]["annotations"])
        replicas = [Replica("replica-0", api, certs, args), Replica("replica-1", api, certs, args)]
        count = 0
        try:
            for rnd in range(args.rounds * 2):
                how = ("SIGKILL", "SIGTERM")[rnd % 2]
                deadline = time.monotonic() + 120
                while not (leaders := [r for r in replicas if r.ready(http)]) or not all(
                        r.readyz(http) == "ok" or r.readyz(http).startswith("not the leader") for r in replicas):
                    if time.monotonic() > deadline:
                        raise SystemExit("no replica became the leader in 120 s")
                    time.sleep(0.1)
                count += 1
                assert bind_once(http, replicas, api, count), f"the leader did not bind: {LAST[0]}"
                leader = leaders[0]
                t0 = time.monotonic()
                leader.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
                while True:
                    count += 1
                    if bind_once(http, [r for r in replicas if r is not leader], api, count):
                        break
                    if time.monotonic() - t0 > 60:
                        raise SystemExit("no bind within 60 s of the leader's end")
                    time.sleep(0.05)
                took = time.monotonic() - t0
                results[how].append(took)
                print(f"round {rnd + 1}: {how} {leader.name} -> next successful bind in {took:.2f} s", flush=True)
                leader.proc.wait(timeout=30)
                replicas[replicas.index(leader)] = Replica(f"{leader.name}-{rnd}", api, certs, args)
        finally:
            for r in replicas:
                r.proc.kill()
                r.proc.wait(timeout=10)
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"lease {args.lease} s, renew deadline {args.renew_deadline} s, retry {args.retry} s")
    for how, xs in results.items():
        print(f"{how:<8} kill -> next bind: median {percentile(xs, 50):.2f} s, worst {max(xs):.2f} s "
              f"({len(xs)} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
