"""A burst of pods created against a real kube-apiserver and timed from a watch: when each was created (the create
call's start), bound (spec.nodeName seen) and Running (status.phase seen). Used by bench/dra_scheduling.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch

from bench.common import percentile as _percentile


def percentile(values: list[float], p: float) -> float:
    return _percentile(values, p) if values else float("nan")


@dataclass
class Burst:
    """What became of a burst of pods; times in seconds from the first create."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # pod -> the node's reason
    create_s: float = 0.0  # the last create call's end

    def report(self, title: str, pods: int) -> str:
        def rate(done: dict[str, float]) -> str:
            return f"{len(done) / max(done.values()):6.1f} pods/s" if done else "   n/a"

        to_run = [self.running[p] - self.created[p] for p in self.running]
        to_bind = [self.bound[p] - self.created[p] for p in self.bound]
        lines = [f"{title}: {pods} pods created in {self.create_s:.1f} s",
                 f"  bound   {len(self.bound):4d}/{pods}  {rate(self.bound)}  create->bound   "
                 f"p50 {percentile(to_bind, 50):6.2f} s  p99 {percentile(to_bind, 99):6.2f} s",
                 f"  Running {len(self.running):4d}/{pods}  {rate(self.running)}  create->Running "
                 f"p50 {percentile(to_run, 50):6.2f} s  p99 {percentile(to_run, 99):6.2f} s"]
        if self.failed:
            lines.append(f"  failed by their node: {len(self.failed)} (e.g. {next(iter(self.failed.values()))})")
        return "\n".join(lines)


def _watch(core: k8s.CoreV1Api, ns: str, out: Burst, t0: list[float], want: int, stop: threading.Event) -> None:
    rv = ""
    while not stop.is_set():
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=5):
            obj = ev["object"]
            rv = obj.metadata.resource_version
            now = time.monotonic() - t0[0]
            name = obj.metadata.name
            if obj.spec.node_name and name not in out.bound:
                out.bound[name] = now
            phase = obj.status.phase if obj.status else None
            if phase == "Running" and name not in out.running:
                out.running[name] = now
            elif phase == "Failed" and name not in out.failed:
                out.failed[name] = f"{obj.status.reason}: {obj.status.message}"
            if len(out.running) + len(out.failed) >= want or stop.is_set():
                w.stop()
                stop.set()
                return


def run_burst(api: k8s.ApiClient, ns: str, bodies: Sequence[dict[str, Any]], timeout: float,
              workers: int = 4) -> Burst:
    """Create `bodies` in `ns` from `workers` threads at once; return when all are Running or failed, or after
    `timeout` seconds (those left are in neither)."""
    core = k8s.CoreV1Api(api)
    out = Burst()
    t0 = [time.monotonic()]
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(core, ns, out, t0, len(bodies), stop), daemon=True)
    watcher.start()
    time.sleep(0.5)  # the watch is open before the first create
    t0[0] = time.monotonic()

    def create(body: dict[str, Any]) -> None:
        out.created[body["metadata"]["name"]] = time.monotonic() - t0[0]
        core.create_namespaced_pod(ns, body)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, bodies))
    out.create_s = time.monotonic() - t0[0]
    stop.wait(timeout)
    stop.set()
    watcher.join(10)
    return out
