"""How often a multi-GPU pod lands within one NVLink island: topology-aware placement against first-fit.

    .venv/bin/python bench/multi_gpu_placement.py [--seed 1] [--pods 20000] [--nodes 4] [--load 0.8]

A seeded stream of pods arrives at and leaves a cluster of --nodes nodes, each of 8 x 80 GiB GPUs in two NVLink
islands of 4 (island i on NUMA node i), binpack: one-GPU slices (5..40 GiB, 10..50 % compute: 60 % of the pods),
whole GPUs (gpu-count 1, 2 or 4: 25 %) and N-GPU slices (the pod label aliyun.com/gpu-count 2 or 4, 10..40 GiB and
10..50 % on each: 15 %). Arrivals are a Poisson stream, lifetimes exponential, the mean chosen so the GPUs asked
for would fill --load of the cluster. Each pod is placed as the scheduler extender places it: the nodes where it
fits (fit: filter), the best score (prioritize; ties to the first node), the GPUs fit chose there (bind). A pod
that fits nowhere is refused and counted.

Run twice over the same stream: topology-aware (the nodes publish their islands and NUMA nodes, as the node daemon
does) and first-fit (the same code on nodes that publish no topology: the placement before topology-aware
placement, the first free GPUs by index for whole GPUs, the binpack order for slices). Printed per run: multi-GPU
pods placed, the share of them within one NVLink island (here also one NUMA node), pods refused (all, multi-GPU),
the mean share of GPU memory held. The figures are the same on every run with the same arguments.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devplugin.allocation.requests import pod_request  # noqa: E402
from devplugin.contract import LABEL_ACK_MULTI_GPU, GpuShare  # noqa: E402
from devplugin.scheduler.fit import Ask, NodeView, ask_of, fit, score  # noqa: E402
from devplugin.scheduler.room import GpuRoom  # noqa: E402

GPUS, PER_ISLAND, GPU_UNITS = 8, 4, 80
DOMAIN = "aliyun.com"


@dataclass(frozen=True)
class Arrival:
    at: float
    lifetime: float
    ask: Ask
    gpus: int  # GPUs the pod's container spans (1 for a one-GPU slice)
    weight: float  # GPUs' worth of room it asks for (for the offered load)


def make_pod(rng: random.Random, n: int) -> tuple[dict, int, float]:
    """(the pod as the apiserver shows it, GPUs it spans, GPUs' worth of memory it asks for)."""
    labels: dict[str, str] = {}
    kind = rng.random()
    if kind < 0.60:
        mem, core, count, span = rng.choice([5, 10, 20, 40]), rng.choice([10, 20, 30, 50]), 0, 1
    elif kind < 0.85:
        count = rng.choice([1, 2, 2, 4])
        mem, core, span = 0, 0, count
    else:
        span = rng.choice([2, 2, 4])
        per = rng.choice([10, 20, 40])
        mem, core, count = per * span, rng.choice([10, 20, 50]) * span, 0
        labels[LABEL_ACK_MULTI_GPU] = str(span)
    limits = {k: str(v) for k, v in ((f"{DOMAIN}/gpu-mem", mem), (f"{DOMAIN}/gpu-core.percentage", core),
                                     (f"{DOMAIN}/gpu-count", count)) if v}
    obj = {"metadata": {"name": f"p{n}", "namespace": "bench", "uid": f"uid-{n}", "labels": labels,
                        "annotations": {}},
           "spec": {"containers": [{"name": "main", "resources": {"limits": limits, "requests": limits}}]},
           "status": {"phase": "Pending"}}
    weight = count if count else mem / GPU_UNITS
    return obj, span, weight


def stream(seed: int, pods: int, nodes: int, load: float) -> list[Arrival]:
    rng = random.Random(seed)
    made = [make_pod(rng, n) for n in range(pods)]
    mean_weight = sum(w for _, _, w in made) / len(made)
    lifetime = 100.0
    rate = load * nodes * GPUS / (mean_weight * lifetime)  # Little's law: rate x lifetime x weight = load x GPUs
    at = 0.0
    out = []
    for obj, span, weight in made:
        at += rng.expovariate(rate)
        out.append(Arrival(at, rng.expovariate(1.0 / lifetime), ask_of(pod_request(obj, DOMAIN)), span, weight))
    return out


def rooms(topology: bool) -> list[GpuRoom]:
    return [GpuRoom(i, f"GPU-{i}", GPU_UNITS, island=i // PER_ISLAND if topology else None,
                    numa=i // PER_ISLAND if topology else None) for i in range(GPUS)]


def release(room: GpuRoom, share: GpuShare) -> None:
    room.mem_used -= share.mem
    room.core_used -= share.core
    room.containers -= 1
    if share.whole:
        room.whole = False


@dataclass
class Result:
    multi: int = 0
    in_island: int = 0
    refused: int = 0
    refused_multi: int = 0
    held_sum: float = 0.0
    samples: int = 0


def run(arrivals: list[Arrival], nodes: int, topology: bool) -> Result:
    cluster = [rooms(topology) for _ in range(nodes)]
    leaving: list[tuple[float, int, int, tuple[GpuShare, ...]]] = []
    res = Result()
    for n, a in enumerate(arrivals):
        while leaving and leaving[0][0] <= a.at:
            _, _, node, shares = heapq.heappop(leaving)
            for s in shares:
                release(cluster[node][s.index], s)
        best: tuple[int, int, tuple[GpuShare, ...]] | None = None
        for i, gpus in enumerate(cluster):
            view = NodeView(f"n{i}", "core_mem", "binpack", 1024, tuple(gpus))
            placed = fit(a.ask, view)
            if not placed.ok:
                continue
            value = score(view, placed)
            if best is None or value > best[0]:
                best = (value, i, placed.containers["main"])
        res.samples += 1
        res.held_sum += sum(r.mem_allocated for g in cluster for r in g) / (nodes * GPUS * GPU_UNITS)
        if best is None:
            res.refused += 1
            res.refused_multi += a.gpus > 1
            continue
        _, node, shares = best
        for s in shares:
            cluster[node][s.index].hold(s)
        heapq.heappush(leaving, (a.at + a.lifetime, n, node, shares))
        if a.gpus > 1:
            res.multi += 1
            res.in_island += len({s.index // PER_ISLAND for s in shares}) == 1
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--load", type=float, default=0.8, help="GPUs asked for over the cluster's GPUs (0..1.5)")
    args = ap.parse_args()
    if args.pods < 1 or args.nodes < 1 or not 0 < args.load <= 1.5:
        ap.error("--pods and --nodes must be at least 1 and --load in (0, 1.5]")
    arrivals = stream(args.seed, args.pods, args.nodes, args.load)
    print(f"{args.pods} pods (seed {args.seed}), {args.nodes} nodes x {GPUS} GPUs in 2 NVLink islands of "
          f"{PER_ISLAND}, offered load {args.load:.2f}")
    print(f"{'placement':<16} {'multi-GPU pods':>14} {'in one island':>14} {'refused':>8} {'refused multi':>14} "
          f"{'memory held':>12}")
    for name, topology in (("topology-aware", True), ("first-fit", False)):
        r = run(arrivals, args.nodes, topology)
        print(f"{name:<16} {r.multi:>14} {100 * r.in_island / max(r.multi, 1):>13.1f}% {r.refused:>8} "
              f"{r.refused_multi:>14} {100 * r.held_sum / max(r.samples, 1):>11.1f}%")


if __name__ == "__main__":
    main()
