"""The control-plane service's own time: extender filter + prioritize + preempt over 1,000 nodes x 8 GPUs with 10
pods per node placed, bind (the apiserver replaced by a no-op: its own time excluded), the admission webhooks, and
the GPU pods per second that filter + prioritize + bind allow one after the other.

Each call goes through the real Starlette app (JSON body in, pydantic models, JSON out) as uvicorn drives it
(one ASGI call on an asyncio loop), without a socket: the figures are what the service adds per call; network,
TLS and HTTP parsing come on top. `function` rows time the plain functions alone. Prints milliseconds, p50 and
p99, the process's CPU time per call beside the wall clock (on a shared machine the wall clock also counts time
the cores spent on other processes), and the garbage collector's passes during the row's calls (how many, how
many of them full, the longest).

The cluster is set up as the service sets itself up: its long-lived objects frozen once the lists are in, and the
oldest generation left to the housekeeping thread where the service does that
(devplugin/scheduler/service.py). Preempt gets kube-scheduler's MetaVictims: for each candidate node the pods on
its least-used GPU, for a pod asking for a whole GPU's memory and half its compute; kube-scheduler sends
max(100, 10 %) of the nodes as candidates by default, and every node at most.

--throughput times GPU pods one after the other as kube-scheduler places them: filter over every node,
prioritize over the nodes that passed, bind to the best, and the pod's watch event (bound, with the choice) into
the state, as the informer does; it prints pods per second. --sizes 1000,2500,5000,10000 prints filter,
prioritize and preempt for several cluster sizes, and their cost per 1,000 nodes.

--code DIR times the package found in DIR (a checkout of another commit, with devplugin/ and
tests/support/scheduler_objects.py) with this same script: before and after a change in one run.

--https runs `devplugin scheduler` as its own process over HTTPS (TLS from openssl, state from its watches of a
fake apiserver holding the same cluster) and times the calls as kube-scheduler and the apiserver make them:
socket, TLS (kept alive), HTTP, JSON; bind there includes the fake apiserver's Binding.

Run: .venv/bin/python bench/scheduler.py [--nodes 1000] [--calls 200] [--throughput 300] [--sizes 1000,5000]
     [--code DIR] [--https]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--code" in sys.argv:  # before any import of the package: time the one in DIR
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--code") + 1]).resolve()))

import asyncio  # noqa: E402

from bench.common import percentile  # noqa: E402
from devplugin.contract import ANN_ALLOCATED, GpuShare, GpuUsage, PodAssignment  # noqa: E402
from devplugin.scheduler import admission, extender  # noqa: E402
from devplugin.scheduler.auth import ExtenderAuth, PeerNames  # noqa: E402
from devplugin.scheduler.http import Service, build_app  # noqa: E402
from devplugin.scheduler.state import ClusterState  # noqa: E402
from tests.support.scheduler_objects import container, node, pod  # noqa: E402

GPUS, UNITS, PODS_PER_NODE = 8, 80, 10
CLIENT = ("127.0.0.1", 50000)


class NoApiserver:
    def get_pod(self, namespace: str, name: str) -> dict:
        raise LookupError(name)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        return None


def cluster(nodes: int, rng: random.Random) -> tuple[ClusterState, list[str]]:
    """Nodes whose daemons publish their usage (the holdings source) and the pods it counts, recorded by them."""
    state = ClusterState()
    names = [f"gpu-node-{i:04d}" for i in range(nodes)]
    placed, node_objs = [], []
    for n in names:
        used: dict[int, list[int]] = {}
        for j in range(PODS_PER_NODE):
            gpu, mem, core = rng.randrange(GPUS), rng.choice((4, 8, 10, 20)), rng.choice((0, 10, 20, 30))
            ann = {ANN_ALLOCATED: PodAssignment(n, 1, {"main": (GpuShare(gpu, "", mem, core),)}).render()}
            placed.append(pod(f"{n}-p{j}", mem=mem, core=core, node_name=n, annotations=ann, phase="Running"))
            u = used.setdefault(gpu, [0, 0, 0])
            u[0], u[1], u[2] = u[0] + mem, u[1] + core, u[2] + 1
        usage = {g: GpuUsage(mem=m, core=c, containers=k) for g, (m, c, k) in used.items()}
        node_objs.append(node(n, gpus=GPUS, units=UNITS, placement=rng.choice(("binpack", "spread")), usage=usage))
    state.replace_nodes(node_objs)
    state.replace_pods(placed)
    return state, names


def kube_scheduler_app(state: ClusterState, apiserver: NoApiserver | None = None) -> object:
    """The app as served: behind the client-certificate check, with this bench's connection named kube-scheduler."""
    peers = PeerNames()
    peers.note(CLIENT, ("kube-scheduler",))  # what the TLS handshake of kube-scheduler's connection records
    return ExtenderAuth(build_app(Service(state, apiserver or NoApiserver())), peers, ["kube-scheduler"])


CPU_MS: list[float] = []  # the CPU time of the last timed() calls, for row()


class GcPasses:
    """The garbage collector's passes while it listens: how many, how many full (the oldest generation), and
    how long each took (ms)."""

    def __init__(self) -> None:
        self.ours = True  # the service runs in this process (not with --https)
        self.listening = False
        self.passes: list[tuple[int, float]] = []
        self._start = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if not self.listening:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.passes.append((info["generation"], (time.perf_counter() - self._start) * 1000))

    def text(self) -> str:
        if not self.ours:
            return "GC (other process)"
        if not self.passes:
            return "GC none"
        full = sum(1 for g, _ in self.passes if g == 2)
        return f"GC {len(self.passes)} passes ({full} full), longest {max(ms for _, ms in self.passes):.1f} ms"


GC = GcPasses()


def timed(fn: Callable[[], object], calls: int) -> list[float]:
    """Wall-clock ms per call; the process's CPU ms per call go to CPU_MS (on a shared machine the wall clock also
    counts the time other processes had the cores; the CPU time is what the service itself spends); the
    collector's passes during the calls to GC."""
    fn()  # warm
    out = []
    CPU_MS.clear()
    GC.passes.clear()
    GC.listening = True
    try:
        for _ in range(calls):
            t, c = time.perf_counter(), time.process_time()
            fn()
            out.append((time.perf_counter() - t) * 1000)
            CPU_MS.append((time.process_time() - c) * 1000)
    finally:
        GC.listening = False
    return out


def row(name: str, ms: list[float], cpu: list[float] | None = None) -> None:
    cpu = CPU_MS if cpu is None else cpu
    cpu_text = f"CPU p50 {percentile(cpu, 50):7.2f} p99 {percentile(cpu, 99):7.2f} ms" if cpu else "CPU (other process)"
    print(f"{name:<46} wall p50 {percentile(ms, 50):7.2f} p99 {percentile(ms, 99):7.2f} ms   {cpu_text}   "
          f"({len(ms)} calls; {GC.text()})")


def settle() -> None:
    """As the service once its first lists are in: the long-lived objects frozen, and, where the service does
    it, the oldest generation left to its housekeeping thread."""
    from devplugin.scheduler import service

    gc.collect()
    gc.freeze()
    if hasattr(service, "collect_oldest_on_schedule"):
        service.collect_oldest_on_schedule()


class Asgi:
    """POST a body to the app as uvicorn would: one ASGI call on an event loop that runs for good in a thread of
    its own (as uvicorn's, so the verbs' worker threads are kept between calls); returns (status, body)."""

    def __init__(self, app: object) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve() -> None:  # the root task, as uvicorn's server task
            ready.set()
            await asyncio.Event().wait()

        threading.Thread(target=self.loop.run_until_complete, args=(serve(),), daemon=True).start()
        ready.wait()

    def post(self, path: str, content: bytes) -> tuple[int, bytes]:
        return asyncio.run_coroutine_threadsafe(self._call(path, content), self.loop).result()

    async def _call(self, path: str, body: bytes) -> tuple[int, bytes]:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "server": ("127.0.0.1", 8443), "client": CLIENT}
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        out: list[dict] = []

        async def receive() -> dict:
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            out.append(message)

        await self.app(scope, receive, send)  # type: ignore[operator]
        return out[0]["status"], b"".join(m.get("body", b"") for m in out[1:])


def review(obj: dict) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "namespace": "default", "operation": "CREATE", "object": obj}}).encode()


def over_https(nodes: int, calls: int) -> int:
    import os
    import shutil
    import socket
    import subprocess
    import tempfile

    import httpx

    from bench.common import REPO, stop
    from devplugin_sim.fake_apiserver import FakeApiserver
    from tests.scheduler.tls_certs import make_ca, make_leaf

    GC.ours = False
    rng = random.Random(7)
    tmp = Path(tempfile.mkdtemp(prefix="gsbench-sched-"))
    ca = make_ca(tmp, "bench-ca")
    cert, key = make_leaf(tmp, ca, "localhost", "serverAuth", ("localhost",))
    client_cert = make_leaf(tmp, ca, "kube-scheduler", "clientAuth")  # what kube-scheduler presents
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with FakeApiserver() as api:
        state, names = cluster(nodes, rng)
        for name in names:
            n = node(name, gpus=GPUS, units=UNITS)
            api.add_node(name, labels=n["metadata"]["labels"], annotations=n["metadata"]["annotations"])
        for name in names:
            for held in state.pods_on(name):
                ns, pname = held.key.split("/")
                share = next(iter(held.shares.values()))[0]
                api.add_pod(name=pname, namespace=ns, node_name=name, phase="Running",
                            limits={"aliyun.com/gpu-mem": share.mem, "aliyun.com/gpu-core.percentage": share.core},
                            annotations={ANN_ALLOCATED: PodAssignment(name, 1, {"main": (share,)}).render()})
        proc = subprocess.Popen(
            [sys.executable, "-m", "devplugin", "scheduler", "--address", "127.0.0.1", "--port", str(port),
             "--tls-cert-file", str(cert), "--tls-private-key-file", str(key), "--client-ca-file", str(ca[0]),
             "--kubeconfig", api.kubeconfig_path,
             "--log-level", "WARNING"], env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"https://127.0.0.1:{port}"
        try:
            with httpx.Client(verify=False, timeout=30, cert=(str(client_cert[0]), str(client_cert[1]))) as http:
                t = time.perf_counter()
                while True:
                    try:
                        if http.get(f"{url}/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.perf_counter() - t > 120:
                        raise SystemExit("devplugin scheduler did not become ready in 120 s")
                    time.sleep(0.2)
                print(f"devplugin scheduler over HTTPS: {nodes} nodes x {GPUS} GPUs, {nodes * PODS_PER_NODE} pods "
                      f"from its watches (ready in {time.perf_counter() - t:.1f} s)")
                asks = pod("bench", containers=[container(mem=12, core=20)])
                body = json.dumps({"Pod": asks, "NodeNames": names}).encode()
                hdr = {"content-type": "application/json"}
                answer = http.post(f"{url}/scheduler/filter", content=body, headers=hdr).json()
                print(f"filter answer: {len(answer['NodeNames'])} nodes pass, {len(answer['FailedNodes'])} fail")
                for verb in ("filter", "prioritize"):
                    r = http.post(f"{url}/scheduler/{verb}", content=body, headers=hdr)
                    assert r.status_code == 200, r.text
                    row(f"{verb} (HTTPS, NodeNames)", timed(
                        lambda verb=verb: http.post(f"{url}/scheduler/{verb}", content=body, headers=hdr), calls))
                it = iter(range(calls * 3))

                def one_bind() -> None:
                    i = next(it)
                    p = api.add_pod(name=f"b{i}", limits={"aliyun.com/gpu-mem": 2})
                    args = {"PodName": f"b{i}", "PodNamespace": "default", "PodUID": p["metadata"]["uid"],
                            "Node": rng.choice(names)}
                    # kube-scheduler filters before it binds; the extender binds only where its filter passed
                    http.post(f"{url}/scheduler/filter", json={"Pod": p, "NodeNames": [args["Node"]]})
                    t0 = time.perf_counter()
                    r = http.post(f"{url}/scheduler/bind", json=args)
                    bind_ms.append((time.perf_counter() - t0) * 1000)
                    assert r.json()["Error"] == "", r.text

                bind_ms: list[float] = []
                for _ in range(calls * 2):
                    one_bind()
                row("bind (HTTPS, with the fake apiserver's Binding)", bind_ms[calls // 10:], [])
                gpu_pod = review(pod("w", containers=[container("a", mem=8, core=20), container("sidecar")]))
                for hook in ("validate", "mutate"):
                    row(f"{hook} webhook (HTTPS)", timed(
                        lambda hook=hook: http.post(f"{url}/admission/{hook}", content=gpu_pod, headers=hdr),
                        calls * 5))
        finally:
            stop(proc)
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def candidates(count: int) -> int:
    """How many candidate nodes kube-scheduler's preemption sends by default (minCandidateNodesPercentage 10,
    minCandidateNodesAbsolute 100) in a cluster of `count` nodes."""
    return min(count, max(100, count // 10))


def preemption(state: ClusterState, names: list[str], victims_on: int) -> bytes:
    """kube-scheduler's preemption call for a pod asking a whole GPU's memory and half its compute, with
    `victims_on` candidate nodes: on each, the pods of its least-used GPU that holds any."""
    metas = {}
    for name in names[:victims_on]:
        by_gpu: dict[int, list[str]] = {}
        for held in state.pods_on(name):
            for shares in held.shares.values():
                for share in shares:
                    by_gpu.setdefault(share.index, []).append(held.uid)
        uids = min(by_gpu.values(), key=len) if by_gpu else []
        metas[name] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
    return json.dumps({"Pod": pod("preemptor", containers=[container(mem=UNITS, core=50)]),
                       "NodeNameToMetaVictims": metas}).encode()


def verbs(http: Asgi, state: ClusterState, names: list[str], calls: int, label: str = "") -> dict[str, list[float]]:
    """filter (every node passes), filter (every node fails, with reasons), prioritize, and preempt with the
    default candidates and with every node; prints a row each, returns their wall-clock times and CPU times."""
    asks = pod("bench", containers=[container(mem=12, core=20)])
    body = json.dumps({"Pod": asks, "NodeNames": names}).encode()
    too_big = pod("too-big", containers=[container(mem=UNITS + 1, core=50)])  # fails everywhere, with reasons
    tight = json.dumps({"Pod": too_big, "NodeNames": names}).encode()
    for verb, b in (("filter", body), ("filter", tight), ("prioritize", body)):
        status, answer = http.post(f"/scheduler/{verb}", content=b)
        assert status == 200, answer
    passed = json.loads(http.post("/scheduler/filter", content=body)[1])
    failed = json.loads(http.post("/scheduler/filter", content=tight)[1])
    n = len(names)
    out: dict[str, list[float]] = {}

    def one(key: str, title: str, path: str, content: bytes) -> None:
        out[key] = timed(lambda: http.post(path, content=content), calls)
        out[key + " cpu"] = list(CPU_MS)
        row(f"{label}{title}", out[key])

    one("filter", f"filter, {len(passed['NodeNames'])} of {n} nodes pass", "/scheduler/filter", body)
    one("filter fail", f"filter, {len(failed['FailedNodes'])} of {n} failing, with reasons", "/scheduler/filter",
        tight)
    one("prioritize", f"prioritize, {n} nodes", "/scheduler/prioritize", body)
    few = candidates(n)
    for key, count in (("preempt", few), ("preempt all", n)):
        pre = preemption(state, names, count)
        status, answer = http.post("/scheduler/preempt", content=pre)
        assert status == 200, answer
        kept = len(json.loads(answer)["NodeNameToMetaVictims"])
        one(key, f"preempt, {count} candidate nodes ({kept} kept)", "/scheduler/preempt", pre)
    return out


def best_host(answer: bytes) -> str:
    """The first node of the highest score in prioritize's answer ([{"Host": name, "Score": n}, ...]), found in the
    text: decoding it would make an object per node in this process, whose collection then lands on the service's
    calls (kube-scheduler reads the answer in a process of its own)."""
    for value in range(10, -1, -1):
        end = answer.find(b', "Score": %d}' % value)
        if end >= 0:
            return str(json.loads(answer[answer.rfind(b'{"Host": ', 0, end) + 9:end]))
    raise ValueError(f"no score in {answer[:200]!r}")


def sampled(count: int) -> int:
    """How many feasible nodes kube-scheduler looks for, and sends the extenders, in a cluster of `count` nodes at
    its default percentageOfNodesToScore (adaptive: 50 % less 1 % per 125 nodes, at least 5 %, at least 100)."""
    return min(count, max(100, count * max(5, 50 - count // 125) // 100))


def kept_answers_memory(state: ClusterState, names: list[str]) -> None:
    """What the answers kept per ask (devplugin/scheduler/ask_answers.py) hold: the memory still allocated after as
    many new asks as are kept were each answered once over every node (tracemalloc), per node and ask."""
    if not hasattr(state, "share_filter"):
        print("kept answers: none in this code")
        return
    import tracemalloc

    from devplugin.scheduler.ask_answers import MAX_ASKS

    state.indexes(names)  # every node's index built first: only the kept answers are counted
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for mem in range(1, MAX_ASKS + 1):
        state.share_filter(mem, 7, names, "")
    grown = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    print(f"kept answers: {grown / MAX_ASKS / len(names):.0f} bytes per node and ask, "
          f"{grown / 2**20:.1f} MiB for {MAX_ASKS} asks over {len(names)} nodes")


def throughput(http: Asgi, state: ClusterState, names: list[str], pods: int, sample: int = 0) -> None:
    """GPU pods one after the other as kube-scheduler places them: filter over every node (or, with `sample`,
    over that many, the window moving on from pod to pod as kube-scheduler's does), prioritize over those that
    passed, bind to the best, then the pod's watch event (bound, with the choice) into the state. Counted: the
    service's time (its calls and the watch event), not the bench's own JSON as kube-scheduler."""
    written: dict[str, Mapping[str, str]] = {}

    class Recorder(NoApiserver):
        def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
            written[name] = annotations

    app = Asgi(kube_scheduler_app(state, Recorder()))
    rng = random.Random(11)
    queue = [pod(f"t{sample}-{i}", mem=rng.choice((2, 4, 8)), core=rng.choice((0, 5, 10))) for i in range(pods + 5)]
    for p in queue:
        state.upsert_pod(p)  # the pending pods, as the watch shows them
    spent = [0.0, 0.0]  # the service's wall clock and CPU time

    def service(fn: Callable[[], object]) -> object:
        t, c = time.perf_counter(), time.process_time()
        try:
            return fn()
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += time.process_time() - c

    window = iter(range(0, 10**9, sample or 1))

    every = json.dumps(names).encode()  # kube-scheduler's own work is kept light: it runs in another process

    def place(p: dict) -> None:
        sent, listed = names, every
        if sample:
            start = next(window) % len(names)
            sent = (names[start:] + names[:start])[:sample]
            listed = json.dumps(sent).encode()
        asks = json.dumps(p).encode()
        body = b'{"Pod": ' + asks + b', "NodeNames": ' + listed + b"}"
        _, answer = service(lambda: app.post("/scheduler/filter", content=body))  # type: ignore[misc]
        if b'"FailedNodes":{},"FailedAndUnresolvableNodes":{}' not in answer:  # some failed: send those that passed
            passed = json.loads(answer)["NodeNames"]
            body = b'{"Pod": ' + asks + b', "NodeNames": ' + json.dumps(passed).encode() + b"}"
        else:
            passed = sent
        _, answer = service(lambda: app.post("/scheduler/prioritize", content=body))  # type: ignore[misc]
        best = best_host(answer) if len(passed) > 1 else passed[0]
        meta = p["metadata"]
        body = json.dumps({"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"],
                           "Node": best}).encode()
        status, answer = service(lambda: app.post("/scheduler/bind", body))  # type: ignore[misc]
        assert status == 200 and json.loads(answer)["Error"] == "", answer
        bound = json.loads(json.dumps(p))
        bound["spec"]["nodeName"] = best
        bound["metadata"]["annotations"].update(written.pop(meta["name"]))
        service(lambda: state.upsert_pod(bound))

    for p in queue[:5]:
        place(p)  # warm
    spent[:] = [0.0, 0.0]
    GC.passes.clear()
    GC.listening = True
    for p in queue[5:]:
        place(p)
    GC.listening = False
    wall, cpu = spent
    sent = f"{sample} of {len(names)} nodes, kube-scheduler's default sample" if sample else f"{len(names)} nodes"
    print(f"throughput: filter ({sent}) + prioritize + bind + the pod's watch event, one pod after "
          f"the other: {pods / wall:.0f} pods/s by the wall clock, {pods / cpu:.0f} pods/s of the process's CPU "
          f"({pods} pods, {wall * 1000 / pods:.2f} ms wall / {cpu * 1000 / pods:.2f} ms CPU each; {GC.text()})")


def sizes(text: str, calls: int) -> None:
    """filter, prioritize and preempt at several cluster sizes, and their CPU time per 1,000 nodes."""
    table = []
    for count in (int(x) for x in text.split(",")):
        gc.unfreeze()
        gc.collect()
        state, names = cluster(count, random.Random(7))
        settle()
        print(f"-- {count} nodes")
        times = verbs(Asgi(kube_scheduler_app(state)), state, names, calls, f"{count:>5} nodes: ")
        table.append((count, times))
        del state, names
    print("CPU p50 per 1,000 nodes (ms):")
    keys = ("filter", "filter fail", "prioritize", "preempt all")
    print(f"{'nodes':>7} " + " ".join(f"{k:>12}" for k in keys))
    for count, times in table:
        print(f"{count:>7} " + " ".join(f"{percentile(times[k + ' cpu'], 50) * 1000 / count:>12.3f}" for k in keys))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--throughput", type=int, default=300, metavar="PODS",
                    help="GPU pods placed one after the other for the pods/s line (0: none)")
    ap.add_argument("--sizes", default="", help="comma-separated cluster sizes: the verbs at each, instead of the rest")
    ap.add_argument("--code", default="", metavar="DIR", help="time the package in DIR (a checkout of another commit)")
    ap.add_argument("--https", action="store_true", help="time `devplugin scheduler` as a process over HTTPS")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    if args.code:
        print(f"code: {Path(extender.__file__).resolve().parents[2]}")
    if args.https:
        return over_https(args.nodes, args.calls)
    if args.sizes:
        sizes(args.sizes, args.calls)
        return 0
    rng = random.Random(7)
    t = time.perf_counter()
    state, names = cluster(args.nodes, rng)
    print(f"cluster: {args.nodes} nodes x {GPUS} GPUs x {UNITS} GiB, {args.nodes * PODS_PER_NODE} pods placed "
          f"(built in {time.perf_counter() - t:.1f} s)")
    settle()
    http = Asgi(kube_scheduler_app(state))
    verbs(http, state, names, args.calls)
    asks = pod("bench", containers=[container(mem=12, core=20)])
    row("filter (function)", timed(lambda: extender.filter_nodes(state, asks, names), args.calls))
    row("prioritize (function)", timed(lambda: extender.prioritize(state, asks, names), args.calls))

    # bind: a fresh pod each call, on a random node; the apiserver write is a no-op.
    binds = []
    for i in range(args.calls * 5):
        p = pod(f"b{i}", mem=2, core=5)
        state.upsert_pod(p)
        binds.append(p)
    it = iter(binds)

    def one_bind() -> None:
        p = next(it)
        args = {"PodName": p["metadata"]["name"], "PodNamespace": "default", "PodUID": p["metadata"]["uid"],
                "Node": rng.choice(names)}
        state.filtered(p["metadata"]["uid"], [args["Node"]])  # kube-scheduler's filter passed the node
        status, answer = http.post("/scheduler/bind", json.dumps(args).encode())
        assert status == 200 and json.loads(answer)["Error"] == "", answer

    row("bind (HTTP, apiserver excluded)", timed(one_bind, args.calls * 2))

    def one_bind_fn() -> None:
        p = next(it)
        where = rng.choice(names)
        state.filtered(p["metadata"]["uid"], [where])
        extender.bind(state, NoApiserver(), "default", p["metadata"]["name"], p["metadata"]["uid"], where)

    row("bind (function)", timed(one_bind_fn, args.calls * 2))

    gpu_pod = review(pod("w", containers=[container("a", mem=8, core=20), container("sidecar")]))
    row("validating webhook (HTTP)", timed(lambda: http.post("/admission/validate", content=gpu_pod),
                                           args.calls * 5))
    row("mutating webhook (HTTP)", timed(lambda: http.post("/admission/mutate", content=gpu_pod), args.calls * 5))
    obj = json.loads(gpu_pod)["request"]["object"]
    row("validate (function)", timed(lambda: admission.validate(obj, UNITS), args.calls * 5))
    kept_answers_memory(state, names)
    if args.throughput:
        throughput(http, state, names, args.throughput)
        if sampled(len(names)) < len(names):
            throughput(http, state, names, args.throughput, sampled(len(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
