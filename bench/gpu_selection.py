"""What a pod's GPU selection (gpushare.io/use-gpu-model, avoid-gpu-uuid, ...) costs the extender: filter and
prioritize over the cluster of bench/scheduler.py (nodes x 8 GPUs, 10 pods per node placed) for one 4 GiB / 10 %
share, without a selection (the per-node index's fast path), with one that allows every GPU (an avoided UUID no
node has: answered from the index), with one that allows none (a model no node has: every node fails with its
reason, the node's models and UUIDs written out), and on a cluster whose nodes have 4 GPUs of each of two models,
with one that allows half of each node (every node placed by fit on its allowed GPUs). The plain functions, in
process; prints milliseconds per call: wall clock p50 and p99, and the process's CPU time p50 (on a shared machine
the wall clock also counts other processes' time).

Run: .venv/bin/python bench/gpu_selection.py [--sizes 1000,5000] [--calls 20]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.scheduler as base  # noqa: E402
from bench.common import percentile  # noqa: E402
from bench.scheduler import CPU_MS, cluster, timed  # noqa: E402
from devplugin.contract import ANN_AVOID_GPU_UUID, ANN_NODE_GPUS, ANN_USE_GPU_MODEL  # noqa: E402
from devplugin.scheduler import extender  # noqa: E402
from tests.support.scheduler_objects import pod  # noqa: E402

SELECTIONS = (
    ("no selection", {}, False),
    ("avoid-gpu-uuid (allows all)", {ANN_AVOID_GPU_UUID: "GPU-5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90"}, False),
    ("use-gpu-model (allows none)", {ANN_USE_GPU_MODEL: "H100"}, False),
    ("no selection, 2 models a node", {}, True),
    ("use-gpu-model (allows half)", {ANN_USE_GPU_MODEL: "H100"}, True),
)


def two_models(name: str, **kw: object) -> dict:
    """bench.scheduler's node, its GPUs 4..7 H100s."""
    obj = NODE(name, **kw)
    inv = json.loads(obj["metadata"]["annotations"][ANN_NODE_GPUS])
    for g in inv["gpus"]:
        if g["index"] >= 4:
            g["model"] = "NVIDIA H100 80GB HBM3"
    obj["metadata"]["annotations"][ANN_NODE_GPUS] = json.dumps(inv)
    return obj


NODE = base.node


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    print(f"{'nodes':>6}  {'selection':<31} {'filter p50':>10} {'p99':>7} {'CPU p50':>7} "
          f"{'prioritize p50':>14} {'p99':>7} {'CPU p50':>7}  passed")
    for size in (int(s) for s in args.sizes.split(",")):
        states = {}
        for mixed in (False, True):
            base.node = two_models if mixed else NODE
            states[mixed] = cluster(size, random.Random(7))
        base.node = NODE
        for label, given, mixed in SELECTIONS:
            state, names = states[mixed]
            p = pod("bench", mem=4, core=10, annotations=given)
            passed = len(extender.filter_nodes(state, p, names).passed)
            f = timed(lambda p=p, st=state, ns=names: extender.filter_nodes(st, p, ns), args.calls)
            f_cpu = list(CPU_MS)
            s = timed(lambda p=p, st=state, ns=names: extender.prioritize(st, p, ns), args.calls)
            print(f"{size:>6}  {label:<31} {percentile(f, 50):>10.1f} {percentile(f, 99):>7.1f} "
                  f"{percentile(f_cpu, 50):>7.1f} {percentile(s, 50):>14.1f} {percentile(s, 99):>7.1f} "
                  f"{percentile(CPU_MS, 50):>7.1f}  {passed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
