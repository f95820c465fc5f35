"""The daemon's own work per container admission, without gRPC: Allocator.preferred + Allocator.allocate for
gpu-mem and gpu-core.percentage on an 8 x 80 GiB node, with the kubelet's `available` lists as protobuf
repeated fields (as the servicer receives them). Prints microseconds per call.

Three cases:
- fixed view: the kubelet's lists never fill up (every call sees every ID), no pod lookup;
- node-local pairing with churn: containers end while others arrive (at most 24 live), the lists shrink and grow;
- pod lookup with churn: the same, plus a pod cache of `--pods` pods bound to the node (those not admitted
  have no GPU request); each admission's pod is added to the cache first, and the daemon's real reporter runs
  (annotation and Event rendered and queued, ListAndWatch health of whole GPUs rebuilt when it changes).

--profile NAME runs one case under cProfile and prints where its time goes.

Run: .venv/bin/python bench/handlers.py [--admissions 3000] [--pods 110] [--profile lookup]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import random
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devplugin.allocation.allocator import Allocator  # noqa: E402
from devplugin.allocation.node import Node  # noqa: E402
from devplugin.allocation.ports import Reporter  # noqa: E402
from devplugin.allocation.requests import PodRequest, pod_request  # noqa: E402
from devplugin.allocation.units import Kind, device_ids  # noqa: E402
from devplugin.api.deviceplugin.v1beta1 import api_pb2  # noqa: E402
from devplugin.app import logs  # noqa: E402
from devplugin.deviceplugin.devices import DeviceBoard  # noqa: E402
from devplugin.gpu.device import GPU  # noqa: E402
from devplugin.kube.reporting import ClusterReporter  # noqa: E402

WARMUP = 100
MAX_LIVE = 24
NODE = "bench-node"
CASES = ("fixed", "pairing", "lookup")


def as_received(ids: list[str], size: int) -> api_pb2.ContainerPreferredAllocationRequest:
    msg = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=size)])
    return api_pb2.PreferredAllocationRequest.FromString(msg.SerializeToString()).container_requests[0]


class ListLookup:
    """The pod cache as the allocator reads it: a snapshot list, no I/O."""

    def __init__(self) -> None:
        self.by_uid: dict[str, PodRequest] = {}

    def pods(self) -> list[PodRequest] | None:
        return list(self.by_uid.values())

    def fetch_now(self, budget_s: float) -> list[PodRequest] | None:
        return self.pods()


class QueueWriter:
    """KubeWriter's interface, queueing what the reporter hands it (the real writer sends it off the path)."""

    def __init__(self) -> None:
        self.queued = 0

    def patch_pod_annotations(self, namespace: str, name: str, uid: str,
                              annotations: dict[str, str | None]) -> None:
        self.queued += 1

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None]) -> None:
        self.queued += 1

    def pod_event(self, namespace: str, name: str, uid: str, type: str, reason: str,  # noqa: A002
                  message: str) -> None:
        self.queued += 1

    def node_event(self, name: str, type: str, reason: str, message: str) -> None:  # noqa: A002
        self.queued += 1


def pod(n: int, mem: int = 0, core: int = 0) -> PodRequest:
    limits = {k: str(v) for k, v in (("aliyun.com/gpu-mem", mem), ("aliyun.com/gpu-core.percentage", core)) if v}
    if not limits:
        limits = {"cpu": "100m"}
    return pod_request({
        "metadata": {"name": f"pod-{n}", "namespace": "default", "uid": f"uid-{n:06d}",
                     "creationTimestamp": "2026-11-23T07:00:00Z"},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending" if mem or core else "Running"}})


class Case:
    """One benchmark case: an allocator, and the kubelet's view of held IDs."""

    def __init__(self, name: str, pods_on_node: int, seed: int) -> None:
        self.name = name
        self.gpus = tuple(GPU(i, f"GPU-{i:08x}-bench-0000-0000-{i:012x}", "H100", 80 << 30, i, f"0000:{i:02x}:00.0",
                              0) for i in range(8))
        self.node = Node(gpus=self.gpus)
        self.lookup = ListLookup() if name == "lookup" else None
        reporter: Reporter = Reporter()
        if name == "lookup":
            board = DeviceBoard(self.node)
            reporter = ClusterReporter(self.node, NODE, QueueWriter(), board.set_occupancy)  # type: ignore[arg-type]
        self.allocator = Allocator(self.node, lookup=self.lookup, reporter=reporter)
        self.all_ids = {k: [i for g in self.gpus for i in device_ids(g, k, self.node.unit)]
                        for k in (Kind.MEM, Kind.CORE)}
        self.fixed = {k: as_received(self.all_ids[k], size) for k, size in ((Kind.MEM, 4), (Kind.CORE, 20))}
        self.held: dict[Kind, set[str]] = {Kind.MEM: set(), Kind.CORE: set()}
        self.live: deque[tuple[str, dict[Kind, list[str]]]] = deque()
        self.rng = random.Random(seed)
        self.pods_on_node = pods_on_node
        self.n = 0
        if self.lookup is not None:
            for _ in range(pods_on_node - 1):
                self._add(pod(self._next()))
        self.spent = {"GetPreferredAllocation": 0.0, "Allocate": 0.0}
        self.refused = 0
        self.profiler: cProfile.Profile | None = None  # enabled around the daemon's calls only

    def _next(self) -> int:
        self.n += 1
        return self.n

    def _add(self, p: PodRequest) -> None:
        assert self.lookup is not None
        self.lookup.by_uid[p.uid] = p

    def _remove_filler(self) -> None:
        assert self.lookup is not None
        uid = next(u for u, p in self.lookup.by_uid.items() if not p.gpu_containers)
        del self.lookup.by_uid[uid]

    def admit(self, timed: bool) -> None:
        """One container admission: GetPreferredAllocation + Allocate for gpu-mem then gpu-core.percentage."""
        if self.name == "fixed":
            requests = self.fixed
            uid = ""
        else:
            if len(self.live) >= MAX_LIVE:
                self._end(*self.live.popleft())
            sizes = {Kind.MEM: self.rng.randint(1, 8), Kind.CORE: self.rng.choice(range(5, 35, 5))}
            requests = {k: as_received([i for i in self.all_ids[k] if i not in held], n)
                        for k, n in sizes.items() for held in (self.held[k],)}
            uid = ""
            if self.lookup is not None:
                p = pod(self._next(), sizes[Kind.MEM], sizes[Kind.CORE])
                if len(self.lookup.by_uid) >= self.pods_on_node:
                    self._remove_filler()
                self._add(p)
                uid = p.uid
        got: dict[Kind, list[str]] = {}
        prof = self.profiler if timed else None
        for kind, req in requests.items():
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            try:
                ids = self.allocator.preferred(kind, req.available_deviceIDs, req.must_include_deviceIDs,
                                               req.allocation_size)
                t1 = time.perf_counter()
                self.allocator.allocate(kind, ids)
            except Exception:
                self.refused += 1
                self._end(uid, got)
                return
            finally:
                if prof is not None:
                    prof.disable()
            t2 = time.perf_counter()
            got[kind] = ids
            if timed:
                self.spent["GetPreferredAllocation"] += t1 - t0
                self.spent["Allocate"] += t2 - t1
        if self.name != "fixed":
            for kind, ids in got.items():
                self.held[kind].update(ids)
            self.live.append((uid, got))

    def _end(self, uid: str, got: dict[Kind, list[str]]) -> None:
        for kind, ids in got.items():
            self.held[kind].difference_update(ids)
        if self.lookup is not None and uid:
            del self.lookup.by_uid[uid]
            self.allocator.pod_ended(uid)
            self._add(pod(self._next()))


def run(case: Case, admissions: int) -> None:
    for _ in range(WARMUP):
        case.admit(False)
    for _ in range(admissions):
        case.admit(True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admissions", type=int, default=3000)
    parser.add_argument("--pods", type=int, default=110, help="pods bound to the node in the lookup case")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", choices=CASES, help="profile this case instead of timing all three")
    parser.add_argument("--top", type=int, default=25, help="with --profile: functions to list")
    parser.add_argument("--log-level", choices=("INFO", "WARNING"), default="WARNING",
                        help="the daemon's log level (`devplugin serve` logs at INFO by default); logs go to "
                             "/dev/null through the daemon's own text formatter")
    args = parser.parse_args()
    if args.admissions < 1 or args.pods < 2:
        parser.error("--admissions must be at least 1 and --pods at least 2")
    logs.setup(args.log_level)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115
    if args.profile:
        case = Case(args.profile, args.pods, args.seed)
        case.profiler = prof = cProfile.Profile()
        run(case, args.admissions)
        print(f"{args.profile}: cProfile of GetPreferredAllocation + Allocate over {args.admissions} admissions "
              "(times include the profiler's overhead); by own time, then by cumulative time:")
        for key in ("tottime", "cumulative"):
            pstats.Stats(prof).strip_dirs().sort_stats(key).print_stats(args.top)
        return 0
    print(f"8 x 80 GiB node, 640 gpu-mem and 800 gpu-core IDs, log level {args.log_level}; mean over "
          f"{args.admissions} admissions:")
    for name in CASES:
        case = Case(name, args.pods, args.seed)
        run(case, args.admissions)
        calls = 2 * args.admissions
        what = {"fixed": "fixed view (every ID available), no pod lookup",
                "pairing": "node-local pairing, containers ending while others arrive",
                "lookup": f"pod lookup, {args.pods} pods in the cache, containers ending while others arrive"}[name]
        print(f"{what}:" + (f" ({case.refused} refused)" if case.refused else ""))
        for call, seconds in case.spent.items():
            print(f"  {call}: {seconds / calls * 1e6:.1f} us per call")
        print(f"  one admission (4 calls): {sum(case.spent.values()) / args.admissions * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
