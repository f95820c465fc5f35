"""A tenant floods the admission webhooks: what the service's memory and its legitimate callers see meanwhile.

`devplugin scheduler` runs as its own process over HTTPS, as shipped (every flag at its default, TLS from openssl,
client certificates checked, its state from its watches of a fake apiserver holding --nodes nodes x 8 GPUs with 10
pods each). Three kinds of callers:

- the flood: --flood-connections anonymous connections (40 by default, as many reviews as the service once ran
  at once) from 127.0.0.1, spread over --flood-processes processes, each posting the worst bodies a tenant can
  (tests/scheduler/review_bodies.py) back to back, in turn: a review of a pod of 36,000 containers (3.9 MiB), of one
  container with 70,000 reserved env names, and the most expensive review the limits let through (1,000
  containers, 17,000 reserved env names, an annotation filling 3.9 MiB);
- the apiserver, from 127.0.0.2: a review of an ordinary GPU pod every 50 ms (with --auth cert it presents its
  client certificate, and the service runs with --webhook-client-names kube-apiserver);
- kube-scheduler, from 127.0.0.3 with its client certificate: a filter over every node every 100 ms.

A quiet phase first, then the flood. The service's RSS is sampled from /proc every 20 ms. Prints, per phase, the
apiserver's reviews and kube-scheduler's filters (p50, p99, the slowest, how many failed: an error, or no answer
within the 5 s the shipped webhooks and kube-scheduler wait), the peak RSS against half the memory limit the
Deployment ships, and the flood's posts by answer. Targets: reviews p99 <= 50 ms, RSS under half the limit.

The service runs on CPU 0 (--service-cpus) and every caller on the others, as in a cluster, where the tenant's
flood runs on a node of its own: on one machine the callers' TLS would otherwise take the service's CPU.
--service-tree runs the service of another checkout (an earlier commit, for a before and after); a flood that
takes the process past the shipped limit is stopped there (the kubelet would have OOM-killed it).

Run: .venv/bin/python bench/webhook_flood.py [--nodes 1000] [--seconds 30] [--flood-connections 40]
       [--flood-processes 2] [--auth none|cert] [--service-cpus 0] [--service-tree DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import yaml  # noqa: E402
from kubernetes.utils import parse_quantity  # noqa: E402

from bench.common import REPO, percentile, stop  # noqa: E402
from bench.scheduler import GPUS, UNITS, cluster  # noqa: E402
from devplugin.contract import ANN_ALLOCATED, PodAssignment  # noqa: E402
from devplugin_sim.fake_apiserver import FakeApiserver  # noqa: E402
from tests.scheduler import review_bodies  # noqa: E402
from tests.scheduler.tls_certs import make_ca, make_leaf  # noqa: E402
from tests.support.scheduler_objects import container, node, pod  # noqa: E402

BODY = int(3.9 * (1 << 20))
TIMEOUT_S = 5.0  # the shipped webhooks' timeoutSeconds; kube-scheduler's extender httpTimeout is 10 s
FLOOD_FROM, APISERVER_FROM, SCHEDULER_FROM = "127.0.0.1", "127.0.0.2", "127.0.0.3"


def shipped_limit() -> int:
    docs = yaml.safe_load_all((REPO / "deploy" / "scheduler" / "deployment.yaml").read_text())
    [deployment] = [d for d in docs if d and d["kind"] == "Deployment"]
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return int(parse_quantity(c["resources"]["limits"]["memory"]))


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tls_context(ca: Path, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def client(ca: Path, cert: tuple[Path, Path] | None, source: str, timeout: float) -> httpx.Client:
    ctx = tls_context(ca, cert)
    return httpx.Client(verify=ctx, timeout=timeout, transport=httpx.HTTPTransport(verify=ctx, local_address=source))


# --- the flood, in processes of its own ----------------------------------------------------------------------------

def flood_process(url: str, ca: str, connections: int, start_at: float, end_at: float, out: object) -> None:
    bodies = {"wide": review_bodies.wide_pod(BODY), "env": review_bodies.env_bomb(BODY),
              "heaviest accepted": review_bodies.heaviest_accepted(BODY)}
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def one(k: int) -> None:
        names = list(bodies)
        i = k
        c = client(Path(ca), None, FLOOD_FROM, 60)
        while time.time() < start_at:
            time.sleep(0.01)
        while time.time() < end_at:
            name = names[i % len(names)]
            i += 1
            try:
                answer = str(c.post(f"{url}/admission/validate", content=bodies[name],
                                    headers={"content-type": "application/json"}).status_code)
            except httpx.TransportError as exc:  # answered before the body was sent whole, then closed
                answer = type(exc).__name__
                c.close()
                c = client(Path(ca), None, FLOOD_FROM, 60)
            with lock:
                counts[answer] += 1
                counts[f"{name}: {answer}"] += 1
        c.close()

    def report() -> None:  # what was posted so far, so a flood stopped early still says what it did
        with lock:
            out.put((os.getpid(), dict(counts)))  # type: ignore[attr-defined]

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(connections)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and time.time() < end_at + 70:
        report()
        time.sleep(0.5)
    report()


# --- the legitimate callers ----------------------------------------------------------------------------------------

@dataclass
class Calls:
    ms: list[float] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)

    def row(self, name: str) -> str:
        if not self.ms:
            return f"{name:<8} no answer at all; failures: {dict(self.failed)}"
        fails = f", failed {sum(self.failed.values())}: {dict(self.failed)}" if self.failed else ", none failed"
        return (f"{name:<8} p50 {percentile(self.ms, 50):7.2f}  p99 {percentile(self.ms, 99):7.2f}  max "
                f"{max(self.ms):7.2f} ms  ({len(self.ms) + sum(self.failed.values())} calls{fails})")


def pace(every_s: float, until: threading.Event, call: object, calls: Calls) -> None:
    nxt = time.perf_counter()
    while not until.is_set():
        t0 = time.perf_counter()
        try:
            status, ok = call()  # type: ignore[operator]
            if ok:
                calls.ms.append((time.perf_counter() - t0) * 1000)
            else:
                calls.failed[str(status)] += 1
        except httpx.TimeoutException:
            calls.failed["no answer in 5 s"] += 1
        except httpx.TransportError as exc:
            calls.failed[type(exc).__name__] += 1
        nxt += every_s
        until.wait(max(0.0, nxt - time.perf_counter()))


@dataclass
class Phase:
    reviews: Calls = field(default_factory=Calls)
    filters: Calls = field(default_factory=Calls)
    peak_rss: int = 0
    over_limit_at: float = 0.0
    seconds: float = 0.0


def run_phase(seconds: float, url: str, ca: Path, certs: dict[str, tuple[Path, Path]], auth: str, names: list[str],
              pid: int, limit: int, flood: dict | None) -> tuple[Phase, dict]:
    phase = Phase()
    done = threading.Event()
    apiserver = client(ca, certs["kube-apiserver"] if auth == "cert" else None, APISERVER_FROM, TIMEOUT_S)
    scheduler = client(ca, certs["kube-scheduler"], SCHEDULER_FROM, TIMEOUT_S)
    legit = review_bodies.legit()
    asks = __import__("json").dumps({"Pod": pod("bench", containers=[container(mem=12, core=20)]),
                                     "NodeNames": names}).encode()
    hdr = {"content-type": "application/json"}

    def review() -> tuple[int, bool]:
        r = apiserver.post(f"{url}/admission/validate", content=legit, headers=hdr)
        return r.status_code, r.status_code == 200 and r.json()["response"]["allowed"] is True

    def filter_() -> tuple[int, bool]:
        r = scheduler.post(f"{url}/scheduler/filter", content=asks, headers=hdr)
        return r.status_code, r.status_code == 200 and bool(r.json()["NodeNames"])

    procs: list[multiprocessing.process.BaseProcess] = []
    results: dict = {}
    start = time.time() + (8.0 if flood else 0.0)  # the flood processes build their bodies first
    queue = None
    if flood:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        per = [flood["connections"] // flood["processes"]] * flood["processes"]
        per[0] += flood["connections"] - sum(per)
        for n in per:
            p = ctx.Process(target=flood_process, args=(url, str(ca), n, start, start + seconds, queue))
            p.start()
            procs.append(p)
        while time.time() < start:
            time.sleep(0.05)
    workers = [threading.Thread(target=pace, args=(0.05, done, review, phase.reviews), daemon=True),
               threading.Thread(target=pace, args=(0.1, done, filter_, phase.filters), daemon=True)]
    for w in workers:
        w.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        now = rss(pid)
        phase.peak_rss = max(phase.peak_rss, now)
        if now > limit and not phase.over_limit_at:
            phase.over_limit_at = time.perf_counter() - t0
            break
        time.sleep(0.02)
    done.set()
    for w in workers:
        w.join(timeout=TIMEOUT_S + 1)
    latest: dict[int, dict] = {}

    def drain() -> None:
        while queue is not None:
            try:
                pid, counts = queue.get(timeout=0.1)
            except Exception:  # noqa: BLE001 - queue.Empty: nothing more for now
                return
            latest[pid] = counts

    if phase.over_limit_at:
        drain()
        for p in procs:
            p.terminate()
    deadline = time.time() + 90
    while procs and any(p.is_alive() for p in procs) and time.time() < deadline:
        drain()  # a process that put reports exits once they are read
    if flood:
        drain()
        for counts in latest.values():
            for k, v in counts.items():
                results[k] = results.get(k, 0) + v
    phase.seconds = phase.over_limit_at or seconds
    apiserver.close()
    scheduler.close()
    return phase, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the flood")
    ap.add_argument("--quiet-seconds", type=float, default=10.0, help="length of the phase before the flood")
    ap.add_argument("--flood-connections", type=int, default=40)
    ap.add_argument("--flood-processes", type=int, default=2)
    ap.add_argument("--auth", choices=("none", "cert"), default="none",
                    help="cert: the apiserver presents its client certificate, the service answers only it")
    ap.add_argument("--service-tree", type=Path, default=REPO, help="the checkout whose service runs")
    ap.add_argument("--service-cpus", default="0",
                    help="CPUs the service runs on (taskset list; the callers get the others); empty: no pinning")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    service_cpus = {int(c) for c in args.service_cpus.split(",") if c.strip()}
    pin = ["taskset", "-c", args.service_cpus] if service_cpus and len(cpus) > 1 and shutil.which("taskset") else []
    if pin:
        os.sched_setaffinity(0, set(cpus) - service_cpus or set(cpus))  # the callers, flood processes included

    tree = args.service_tree.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="gsbench-flood-"))
    ca = make_ca(tmp, "bench-ca")
    server = make_leaf(tmp, ca, "localhost", "serverAuth", ("localhost",))
    certs = {"kube-scheduler": make_leaf(tmp, ca, "kube-scheduler", "clientAuth"),
             "kube-apiserver": make_leaf(tmp, ca, "kube-apiserver", "clientAuth")}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    limit = shipped_limit()
    with FakeApiserver() as api:
        state, names = cluster(args.nodes, random.Random(7))
        for name in names:
            n = node(name, gpus=GPUS, units=UNITS)
            api.add_node(name, labels=n["metadata"]["labels"], annotations=n["metadata"]["annotations"])
            for held in state.pods_on(name):
                ns, pname = held.key.split("/")
                share = next(iter(held.shares.values()))[0]
                api.add_pod(name=pname, namespace=ns, node_name=name, phase="Running",
                            limits={"aliyun.com/gpu-mem": share.mem, "aliyun.com/gpu-core.percentage": share.core},
                            annotations={ANN_ALLOCATED: PodAssignment(name, 1, {"main": (share,)}).render()})
        extra = ["--webhook-client-names", "kube-apiserver"] if args.auth == "cert" else []
        proc = subprocess.Popen(
            [*pin, sys.executable, "-m", "devplugin", "scheduler", "--address", "127.0.0.1", "--port", str(port),
             "--tls-cert-file", str(server[0]), "--tls-private-key-file", str(server[1]),
             "--client-ca-file", str(ca[0]), "--kubeconfig", api.kubeconfig_path, "--log-level", "WARNING",
             *extra], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"https://127.0.0.1:{port}"
        try:
            with client(ca[0], certs["kube-scheduler"], SCHEDULER_FROM, 5) as c:
                t = time.perf_counter()
                while True:
                    try:
                        if c.get(f"{url}/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.perf_counter() - t > 180 or proc.poll() is not None:
                        raise SystemExit("devplugin scheduler did not become ready")
                    time.sleep(0.2)
            commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip() or "?"
            print(f"devplugin scheduler from {tree} (commit {commit}), auth {args.auth}: {args.nodes} nodes x {GPUS} "
                  f"GPUs, {args.nodes * 10} pods, ready in {time.perf_counter() - t:.1f} s, RSS {rss(proc.pid) >> 20} "
                  f"MiB; the shipped limit {limit >> 20} MiB, half of it {limit >> 21} MiB; service on CPUs "
                  f"{args.service_cpus if pin else 'any'}, callers on {sorted(os.sched_getaffinity(0))}; load average "
                  f"{os.getloadavg()[0]:.1f}")
            quiet, _ = run_phase(args.quiet_seconds, url, ca[0], certs, args.auth, names, proc.pid, limit, None)
            flood = {"connections": args.flood_connections, "processes": args.flood_processes}
            loud, posts = run_phase(args.seconds, url, ca[0], certs, args.auth, names, proc.pid, limit, flood)
            for title, ph in ((f"quiet, {args.quiet_seconds:g} s", quiet),
                              (f"flood, {args.flood_connections} connections, {args.seconds:g} s", loud)):
                print(f"--- {title}: peak RSS {ph.peak_rss >> 20} MiB"
                      + (f", PAST THE {limit >> 20} MiB LIMIT after {ph.over_limit_at:.1f} s: stopped there"
                         if ph.over_limit_at else ""))
                print("  " + ph.reviews.row("reviews"))
                print("  " + ph.filters.row("filters"))
            total = sum(v for k, v in posts.items() if ":" not in k)
            print(f"--- the flood's posts: {total} in {loud.seconds:.1f} s ({total / loud.seconds:.0f}/s): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(posts.items()) if ":" not in k))
            for k, v in sorted(posts.items()):
                if ":" in k:
                    print(f"  {k} {v}")
            print(f"--- the service's RSS now {rss(proc.pid) >> 20} MiB" if proc.poll() is None
                  else f"--- the service exited ({proc.returncode})")
        finally:
            stop(proc)
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
