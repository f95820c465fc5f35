"""From `kubectl apply` of a GPU pod to the workload inside having printed its view: the time a user waits on the
test cluster (tests/realk8s/cluster.py: the real kube-apiserver and kube-scheduler with the extender, a node agent
running the pod's containers under runc, `devplugin serve` on the fake driver, the shim preloaded).

One pod at a time (the cluster otherwise idle), each a share of one GPU (gpu-mem and gpu-core.percentage) running
the workload probe (tests/realk8s/workload/probe.py: NVML, NVIDIA's CUDA runtime through a static-cudart program,
nvidia-smi, then it waits). For each pod: create -> bound (spec.nodeName), -> Running (the node agent's status),
-> the probe's line in the container's log (polled every 20 ms). Prints p50 / p90 / max of each, and the same for
CPU pods of the CUDA image (the void: no GPU, the probe finds no driver). The target: the probe's view within 2 s
(p50) on an idle 2-core machine.

Run: .venv/bin/python bench/pod_start.py [--pods 20] [--nodes 1]
Needs e2e/bin (`make e2e-bin`), build/ (`make native`), root (runc, network namespaces).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realk8s.cluster import Cluster, Spec, running  # noqa: E402
from tests.realk8s.images import WORKLOAD_IMAGE  # noqa: E402
from tests.realk8s.podspecs import Ask, pod  # noqa: E402


def one(cluster: Cluster, ns: str, name: str, gpu: bool) -> tuple[float, float, float]:
    body = pod(name, [Ask(mem=2, core=20)] if gpu else [Ask()])
    body["spec"]["containers"][0]["image"] = WORKLOAD_IMAGE
    t0 = time.monotonic()
    cluster.core.create_namespaced_pod(ns, body)
    bound = running = 0.0
    deadline = t0 + 120
    while time.monotonic() < deadline:
        now = time.monotonic()
        if not bound or not running:
            p = cluster.core.read_namespaced_pod(name, ns)
            if not bound and p.spec.node_name:
                bound = now - t0
            if not running and p.status.phase == "Running":
                running = now - t0
        if bound:
            try:
                if '{"probe"' in cluster.container_logs(ns, name, "c0"):
                    return bound, running or (time.monotonic() - t0), time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not started yet
                pass
        time.sleep(0.02)
    raise RuntimeError(f"pod {name}: no probe output within 120 s")


def row(label: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return f"  {label:<28} p50 {statistics.median(xs):6.2f} s   p90 {p90:6.2f} s   max {xs[-1]:6.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=1)
    args = ap.parse_args()
    with running(Spec(nodes=args.nodes, gpus=4, gpu_mib=16 * 1024)) as cluster:
        print(f"cluster up in {cluster.took:.1f} s ({args.nodes} node(s))", flush=True)
        ns = cluster.namespace("bench")
        for gpu in (True, False):
            times = [one(cluster, ns, f"{'gpu' if gpu else 'cpu'}-{i}", gpu) for i in range(args.pods)]
            print(f"{'GPU share (2 GiB, 20 %)' if gpu else 'CPU pod of the CUDA image'}, {args.pods} pods:")
            print(row("create -> bound", [t[0] for t in times]))
            print(row("create -> Running", [t[1] for t in times]))
            print(row("create -> probe's view", [t[2] for t in times]), flush=True)
            cluster.clear_namespace(ns)
            ns = cluster.namespace("bench")


if __name__ == "__main__":
    main()
