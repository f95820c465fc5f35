"""Admission with pod lookup against admission by node-local pairing, in one run, same client and workload.

Two daemons (`devplugin serve` as a process) on the same fake 8 x 80 GiB node, one after the other:
- node-local pairing: no apiserver; the daemon pairs a container's gpu-mem and gpu-core.percentage calls;
- pod lookup: linked to the fake apiserver, which holds `pods_on_node` pods bound to the node (pods without GPU
  requests fill up to that number); before each admission the container's pod is added, bound to the node, and
  the daemon's pod cache sees it through its watch; the daemon then names the container from the cache, places
  its whole request at once and records it (annotation patch and Event, off the admission path).
Each admission then is GetPreferredAllocation + Allocate for gpu-mem and gpu-core.percentage, in random order,
from the kubelet-side client; pods end (deleted from the apiserver, their IDs available again) while others
arrive. Figures are the client's time around the 4 RPCs. Direct LISTs of pods made during the measured
admissions are counted: each is an admission whose pod the cache had not seen yet.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.clients import CppClient, DrivenClient, PythonClient
from bench.common import CORE, MEM, gpus, percentile, start_daemon, stop, workdir
from devplugin.allocation.units import Kind
from devplugin.deviceplugin.daemon import socket_name
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver
from devplugin_sim.kubelet import KubeletEmulator

NODE = "bench-node"
MAX_LIVE = 24  # more live containers than this and one is always released first (as in bench/admission.py)
CORE_CHOICES = range(5, 35, 5)


@dataclass
class LookupResult:
    mode: str
    client: str
    admissions: int
    refused: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    gpa_p50_ms: float
    allocate_p50_ms: float
    empty_rpc_ms: float
    direct_lists: int = 0
    pods_on_node: int = 0
    first_refusal: str = ""


def measure(client: str, cpp_binary: Path, admissions: int, warmup: int, seed: int, settle_s: float,
            pods_on_node: int) -> list[LookupResult]:
    """Node-local pairing first, then pod lookup."""
    return [_run(lookup, client, cpp_binary, admissions, warmup, seed, settle_s, pods_on_node)
            for lookup in (False, True)]


def _run(lookup: bool, client_kind: str, cpp_binary: Path, admissions: int, warmup: int, seed: int,
         settle_s: float, pods_on_node: int) -> LookupResult:
    root = workdir()
    api = FakeApiserver().start() if lookup else None
    try:
        driver = FakeDriver.create(root / "drv", gpus(8, 80 * 1024))
        cluster = _Cluster(api, pods_on_node) if api is not None else None
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            daemon = start_daemon(driver, root, node_name=NODE if api else "",
                                  kubeconfig=api.kubeconfig_path if api else "")
            try:
                if not kubelet.wait_for(lambda k: k.allocatable().get(CORE, 0) == 800, timeout=30):
                    raise RuntimeError("the daemon did not register with the kubelet emulator within 30 s")
                # The client drives the plugin sockets itself, outside the emulator's books: the kubelet's
                # PodResources would list none of its containers and the daemon would forget them. Take it away once
                # registered; the daemon then keeps its view from the calls' available IDs, as it must with a
                # kubelet that cannot answer.
                (root / "pr.sock").unlink(missing_ok=True)
                sockets = {res: root / "dp" / socket_name("aliyun.com", kind)
                           for res, kind in ((MEM, Kind.MEM), (CORE, Kind.CORE))}
                client: DrivenClient
                if client_kind == "cpp":
                    client = CppClient(cpp_binary, sockets)
                else:
                    client = PythonClient(sockets, {r: sorted(kubelet.devices(r)) for r in (MEM, CORE)})
                try:
                    return _drive(client, cluster, admissions, warmup, seed, settle_s, lookup)
                finally:
                    client.close()
            finally:
                stop(daemon)
    finally:
        if api is not None:
            api.stop()
        shutil.rmtree(root, ignore_errors=True)


class _Cluster:
    """The pods bound to the node in the fake apiserver: GPU pods as they come and go, filler pods around them."""

    def __init__(self, api: FakeApiserver, total: int) -> None:
        self.api = api
        self.total = total
        api.add_node(NODE, labels={"ack.node.gpu.schedule": "core_mem"})
        self.fillers: list[str] = []
        self.gpu_pods: set[str] = set()
        self._n = 0
        self._top_up(0)

    def _top_up(self, coming: int) -> None:
        while len(self.fillers) + len(self.gpu_pods) + coming < self.total:
            self._n += 1
            name = f"filler-{self._n}"
            self.api.add_pod(name=name, node_name=NODE, limits={"cpu": "100m"}, phase="Running")
            self.fillers.append(name)
        while self.fillers and len(self.fillers) + len(self.gpu_pods) + coming > self.total:
            self.api.delete_pod("default", self.fillers.pop(0))

    def add(self, name: str, request: dict[str, int]) -> None:
        self._top_up(1)
        self.api.add_pod(name=name, node_name=NODE, limits=request)
        self.gpu_pods.add(name)

    def delete(self, name: str) -> None:
        self.api.delete_pod("default", name)
        self.gpu_pods.discard(name)

    def direct_lists(self) -> int:
        return len(self.api.requests_matching("GET", "/pods", watch=False))


def _drive(client: DrivenClient, cluster: _Cluster | None, admissions: int, warmup: int, seed: int,
           settle_s: float, lookup: bool) -> LookupResult:
    rng = random.Random(seed)
    live: list[str] = []
    totals: list[float] = []
    gpa: list[float] = []
    alloc: list[float] = []
    refused = 0
    first_refusal = ""
    lists_before = 0
    for i in range(admissions + warmup):
        if i == warmup and cluster is not None:
            lists_before = cluster.direct_lists()
        if len(live) > MAX_LIVE or (live and rng.random() < 0.5):
            gone = live.pop(rng.randrange(len(live)))
            client.release(gone)
            if cluster is not None:
                cluster.delete(gone)
        request = [(MEM, rng.randint(1, 8)), (CORE, rng.choice(CORE_CHOICES))]
        rng.shuffle(request)
        name = f"bench-{i}"
        if cluster is not None:
            cluster.add(name, dict(request))
        _pause(settle_s)  # the pod cache sees the pod (and the daemon is as idle as with pod lookup)
        out = client.admit(name, request)
        if not out.ok:
            refused += 1
            first_refusal = first_refusal or out.why
            if cluster is not None:
                cluster.delete(name)
            continue
        live.append(name)
        if i >= warmup:
            totals.append(out.total_ms)
            gpa.append(out.gpa_ms / 2)
            alloc.append(out.allocate_ms / 2)
    if not totals:
        raise RuntimeError(f"every admission was refused ({first_refusal})")
    lists = cluster.direct_lists() - lists_before if cluster is not None else 0
    return LookupResult("pod lookup" if lookup else "node-local pairing", client.name, len(totals), refused,
                        percentile(totals, 50), percentile(totals, 99), max(totals), percentile(gpa, 50),
                        percentile(alloc, 50), client.empty_rpc_ms, lists,
                        cluster.total if cluster is not None else 0, first_refusal)


def _pause(seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
    end = clock() + seconds
    while (left := end - clock()) > 0:
        time.sleep(left)


def report(results: list[LookupResult], out: Callable[[str], object] = print) -> None:
    for r in results:
        where = f", {r.pods_on_node} pods on the node in the apiserver" if r.pods_on_node else ", no apiserver"
        out(f"{r.client} client, {r.mode}{where}: {r.admissions} admissions (refused: {r.refused}): "
            f"p50 {r.p50_ms:.3f} ms, p99 {r.p99_ms:.3f} ms, max {r.max_ms:.3f} ms; per call p50: "
            f"GetPreferredAllocation {r.gpa_p50_ms:.3f} ms, Allocate {r.allocate_p50_ms:.3f} ms, "
            f"empty RPC {r.empty_rpc_ms:.3f} ms")
        if r.pods_on_node:
            out(f"{r.client} client, {r.mode}: direct pod LISTs during the measured admissions: {r.direct_lists} "
                "(each one an admission whose pod the cache had not seen)")
        if r.first_refusal:
            out(f"{r.client} client, {r.mode}: first refusal: {r.first_refusal}")
    if len(results) == 2 and results[0].p50_ms > 0:
        a, b = results
        out(f"{b.client} client: pod lookup / node-local pairing: p50 {b.p50_ms / a.p50_ms:.2f}x, "
            f"p99 {b.p99_ms / a.p99_ms:.2f}x")
    sys.stdout.flush()
