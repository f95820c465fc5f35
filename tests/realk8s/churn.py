"""Random churn on a realk8s cluster: seeded pods of random sizes created in bursts, pods deleted at random, and
what became of each: Running (with its create-to-Running time), refused by its node (with the cause), or left
Pending (and whether some node had room for it). Used by tests/realk8s/placement/test_churn.py and
bench/cluster_churn.py."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch

from tests.realk8s.books import free_room
from tests.realk8s.podspecs import CORE, COUNT, MEM, Ask, pod, refusal


@dataclass(frozen=True)
class Shape:
    """The mix of pods: sizes and how often each kind comes."""

    mem: tuple[int, int] = (1, 40)  # gpu-mem units per container
    core: tuple[int, int] = (5, 60)  # percent, multiples of 5
    two_containers: float = 0.3
    whole_gpu: float = 0.05  # pods asking for gpu-count (1, sometimes 2)


def random_pod(rng: random.Random, name: str, shape: Shape) -> dict[str, Any]:
    if rng.random() < shape.whole_gpu:
        return pod(name, [Ask(count=1 if rng.random() < 0.8 else 2)])
    n = 2 if rng.random() < shape.two_containers else 1
    return pod(name, [Ask(mem=rng.randint(*shape.mem), core=5 * rng.randint(shape.core[0] // 5, shape.core[1] // 5))
                      for _ in range(n)])


class PodWatch:
    """A watch of one namespace's pods: the latest object of each, and when each was first seen Running."""

    def __init__(self, core: k8s.CoreV1Api, ns: str) -> None:
        self.core, self.ns = core, ns
        self.pods: dict[str, k8s.V1Pod] = {}
        self.running_at: dict[str, float] = {}
        self.changed = threading.Condition()
        self._stop = threading.Event()
        self._w = watch.Watch()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{ns}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the watch of namespace {ns} did not start")

    def _run(self) -> None:
        rv = self.core.list_namespaced_pod(self.ns).metadata.resource_version
        self._ready.set()
        while not self._stop.is_set():
            try:
                for ev in self._w.stream(self.core.list_namespaced_pod, self.ns, resource_version=rv,
                                         timeout_seconds=30, allow_watch_bookmarks=False):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    with self.changed:
                        name = obj.metadata.name
                        if ev["type"] == "DELETED":
                            self.pods.pop(name, None)
                        else:
                            self.pods[name] = obj
                            if obj.status.phase == "Running" and name not in self.running_at:
                                self.running_at[name] = time.monotonic()
                        self.changed.notify_all()
                    if self._stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - the apiserver went away (fault tests) or the watch expired: relist
                if self._stop.wait(0.5):
                    return
                try:
                    items = self.core.list_namespaced_pod(self.ns)
                except Exception:  # noqa: BLE001
                    continue
                rv = items.metadata.resource_version
                with self.changed:
                    self.pods = {p.metadata.name: p for p in items.items}
                    for p in items.items:
                        if p.status.phase == "Running":
                            self.running_at.setdefault(p.metadata.name, time.monotonic())
                    self.changed.notify_all()

    def wait(self, cond: Callable[[dict[str, k8s.V1Pod]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not cond(self.pods):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.5))
            return True

    def snapshot(self) -> dict[str, k8s.V1Pod]:
        with self.changed:
            return dict(self.pods)

    def stop(self) -> None:
        self._stop.set()
        self._w.stop()


def pod_asks(p: k8s.V1Pod) -> tuple[list[tuple[int, int, int]], int]:
    """The app containers' (gpu-mem, core, gpu-count) and the pod's multi-GPU count."""
    asks = []
    for c in p.spec.containers:
        lim = (c.resources.limits if c.resources else None) or {}
        asks.append((int(lim.get(MEM, 0)), int(lim.get(CORE, 0)), int(lim.get(COUNT, 0))))
    n = int((p.metadata.labels or {}).get("aliyun.com/gpu-count", "1") or 1)
    return asks, n


def fits(room: dict[str, tuple[int, int, bool]], asks: list[tuple[int, int, int]], n: int = 1) -> bool:
    """Whether the containers fit these GPUs together, each share on one GPU (or evenly on n), whole GPUs on
    untouched ones: a small exhaustive search."""
    todo = sorted((a for a in asks if any(a)), key=lambda a: (-a[2], -a[0], -a[1]))

    def place(i: int, gpus: dict[str, tuple[int, int, bool]]) -> bool:
        if i == len(todo):
            return True
        mem, core, count = todo[i]
        if count:
            free = [u for u, g in gpus.items() if g[2]]
            return len(free) >= count and place(i + 1, {**gpus, **{u: (0, 0, False) for u in free[:count]}})
        mem, core = mem // n, core // n
        cands = [u for u, g in gpus.items() if g[0] >= mem and g[1] >= core]
        if n > 1:
            return len(cands) >= n and place(i + 1, {**gpus, **{u: (gpus[u][0] - mem, gpus[u][1] - core, False)
                                                               for u in cands[:n]}})
        return any(place(i + 1, {**gpus, u: (gpus[u][0] - mem, gpus[u][1] - core, False)}) for u in cands)

    return place(0, dict(room))


_NUM = re.compile(r"\d+")


def cause(message: str) -> str:
    """A refusal's cause with its figures taken out, so refusals can be counted by kind."""
    text = message.split("desc = ", 1)[-1]
    text = re.sub(r"\(GPU \d.*", "", text)  # the per-GPU room listing
    text = re.sub(r"container [^:]+: ", "", text)
    return _NUM.sub("N", text).strip()[:140]


@dataclass
class ChurnResult:
    created: int = 0
    deleted: int = 0
    running: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)  # (pod, message)
    pending: list[str] = field(default_factory=list)
    pending_with_room: list[str] = field(default_factory=list)
    create_to_running: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def causes(self) -> Counter[str]:
        return Counter(cause(m) for _, m in self.refused)

    def report(self, title: str) -> str:
        lat = sorted(self.create_to_running)
        p50 = lat[len(lat) // 2] * 1000 if lat else 0.0
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else 0.0
        lines = [f"{title}: {self.created} pods created, {self.deleted} deleted, {self.running} ran, "
                 f"{len(self.refused)} refused by their node, {len(self.pending)} left Pending "
                 f"({len(self.pending_with_room)} while a node had room); create to Running p50 {p50:.0f} ms, "
                 f"p99 {p99:.0f} ms; {self.running / self.seconds if self.seconds else 0:.1f} admissions/s "
                 f"(pods Running) over {self.seconds:.1f} s"]
        for why, n in self.causes().most_common():
            lines.append(f"  refused x{n}: {why}")
        return "\n".join(lines)


def run_churn(core: k8s.CoreV1Api, ns: str, books: Callable[[], dict[str, dict[str, Any]]], *, seed: int,
              pods: int, burst: int = 12, delete_fraction: float = 0.35, shape: Shape | None = None,
              settle_s: float = 30.0, during: Callable[[int], None] | None = None,
              settled: Callable[[int, list[k8s.V1Pod]], None] | None = None) -> ChurnResult:
    """Create `pods` pods in bursts; after each burst settles, delete a random `delete_fraction` of the live ones.
    `during(burst_number)` runs right after each burst is created (fault injection); `settled(burst_number, pods)`
    once the burst's pods settled, before any deletion (the pods as the watch last saw them: checks of them while
    the churn goes on). Returns what became of every pod."""
    rng = random.Random(seed)
    shape = shape or Shape()
    res = ChurnResult()
    created_at: dict[str, float] = {}
    w = PodWatch(core, ns)
    t0 = time.monotonic()
    try:
        n = 0
        burst_no = 0
        while n < pods:
            names = []
            for _ in range(min(burst, pods - n)):
                name = f"p{n:05d}"
                body = random_pod(rng, name, shape)
                created_at[name] = time.monotonic()
                core.create_namespaced_pod(ns, body)
                names.append(name)
                n += 1
            res.created += len(names)
            if during is not None:
                during(burst_no)  # while the burst is in flight
            burst_no += 1
            w.wait(lambda ps, names=names: all(_settled_or_stuck(ps.get(x)) for x in names), settle_s)
            if settled is not None:
                snap = w.snapshot()
                settled(burst_no - 1, [snap[x] for x in names if x in snap])
            live = [name for name, p in w.snapshot().items() if p.status.phase == "Running"
                    and p.metadata.deletion_timestamp is None]
            for name in rng.sample(live, int(len(live) * delete_fraction)):
                core.delete_namespaced_pod(name, ns)
                res.deleted += 1
        _quiesce(w, books, settle_s)
        res.seconds = time.monotonic() - t0
        final = w.snapshot()
        for name, p in sorted(final.items()):
            msg = refusal(p)
            if msg:
                res.refused.append((name, msg))
            elif p.status.phase == "Pending" and p.metadata.deletion_timestamp is None:
                res.pending.append(name)
        for name, at in w.running_at.items():
            if name in created_at:
                res.create_to_running.append(at - created_at[name])
        res.running = len(res.create_to_running)
        res.pending_with_room = pending_with_room(final, books())
        return res
    finally:
        w.stop()


def _settled_or_stuck(p: k8s.V1Pod | None) -> bool:
    if p is None:
        return False
    if p.status.phase in ("Running", "Failed", "Succeeded"):
        return True
    return any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or [])


def pending_with_room(pods: dict[str, k8s.V1Pod], books: dict[str, dict[str, Any]]) -> list[str]:
    """Pending, unbound pods that some node has room for, by the kubelets' own books."""
    rooms = {node: free_room(b) for node, b in books.items()}
    out = []
    for name, p in sorted(pods.items()):
        if p.status.phase != "Pending" or p.spec.node_name or p.metadata.deletion_timestamp is not None:
            continue
        asks, n = pod_asks(p)
        where = [node for node, room in rooms.items() if fits(room, asks, n)]
        if where:
            out.append(f"{name} {asks} fits {where}")
    return out


def _quiesce(w: PodWatch, books: Callable[[], dict[str, dict[str, Any]]], timeout: float) -> None:
    """Wait until no pod is in flight (bound but not Running nor Failed, or being deleted) and no Pending pod
    fits some node (kube-scheduler retries them on the node updates a deletion causes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = w.snapshot()
        in_flight = [p for p in pods.values() if p.metadata.deletion_timestamp is not None
                     or (p.spec.node_name and p.status.phase == "Pending")]
        if not in_flight and not pending_with_room(pods, books()):
            return
        time.sleep(0.5)
