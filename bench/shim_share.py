"""Compute shares between containers on one simulated GPU under the real shim, and how fast `default` gives back.

    .venv/bin/python bench/shim_share.py [--grid 132] [--settle 3] [--window 4] [--repeat 3] [--sample-ms 50]
        [--resident]

Every container is one process (or --processes) of `build/shim/tests/gs_probe` launching kernels of GRID blocks
x 1 us back to back with `libgpushare.so` preloaded, its own usage file, CUDA_DEVICE_SM_LIMIT and
GPU_CORE_UTILIZATION_POLICY. The fake driver runs every process's kernels on one shared GPU timeline and its
NVML reports the processes under host pids (pid + 100000). The share each container got is read from the
timeline (GPU time per process), after --settle seconds, over --window seconds. The fake's NVML takes a
utilisation sample every --sample-ms (a real driver's sample period is of that order).

The reclaim time: a 30 % container under `default` runs alone (it bursts into the idle GPU), then a 70 %
container under `force` starts; the time until the newcomer has had at least 65 % in two consecutive 100 ms
ticks. Median and worst of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devplugin_sim.gpu_share import Container, Workload, make_gpu, measure_reclaim, measure_steady  # noqa: E402

# (name, [(share, policy, shim)] per container)
SCENARIOS = [
    ("30 alone, force", [(30, "force", True)]),
    ("70 + 30, force", [(70, "force", True), (30, "force", True)]),
    ("50 + 25 + 25, force", [(50, "force", True), (25, "force", True), (25, "force", True)]),
    ("30 force + unlimited", [(30, "force", True), (100, "force", True)]),
    ("30 force + no shim", [(30, "force", True), (100, "force", False)]),
    ("30 alone, default", [(30, "default", True)]),
    ("30 default + 70 force", [(30, "default", True), (70, "force", True)]),
    ("30 default + 20 force", [(30, "default", True), (20, "force", True)]),
    ("30 default + 30 default", [(30, "default", True), (30, "default", True)]),
    ("50 default + unlimited", [(50, "default", True), (100, "force", True)]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=132, help="blocks per kernel (1 us each)")
    parser.add_argument("--processes", type=int, default=1, help="processes per container")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=3, help="reclaim runs")
    parser.add_argument("--sample-ms", type=int, default=50, help="the fake NVML's sample period")
    parser.add_argument("--resident", action="store_true",
                        help="each per-process sample names the one process resident on the GPU (as an H100 with "
                             "driver 580 reports them), not each process's own part")
    args = parser.parse_args()
    workload = Workload(grid=args.grid)
    work = Path(tempfile.mkdtemp(prefix="gsbench-share-", dir="/tmp"))
    results: dict[str, object] = {"grid": args.grid, "window_s": args.window, "sample_ms": args.sample_ms,
                                  "resident": args.resident, "scenarios": {}}
    print(f"shares on one simulated GPU, kernels of {args.grid} blocks x 1 us, {args.processes} process(es) per "
          f"container, NVML samples every {args.sample_ms} ms, measured over {args.window:g} s after {args.settle:g} s")
    print(f"{'scenario':<26}{'container':<22}{'share':>7}{'got':>8}")
    worst = 0.0
    try:
        for i, (name, spec) in enumerate(SCENARIOS):
            driver = make_gpu(work / f"node{i}", args.sample_ms, resident_samples=args.resident)
            containers = [Container(f"c{k}-{share}{'' if shim else '-noshim'}", share=share, policy=policy,
                                    shim=shim, processes=args.processes)
                          for k, (share, policy, shim) in enumerate(spec)]
            got = measure_steady(driver, work / f"run{i}", containers, args.settle, args.window, workload)
            driver.close()
            results["scenarios"][name] = {c.name: round(got[c.name], 1) for c in containers}
            for k, c in enumerate(containers):
                shown = "none" if c.share == 100 else f"{c.share}%"
                print(f"{name if k == 0 else '':<26}{c.name + ' ' + c.policy:<22}{shown:>7}{got[c.name]:>7.1f}%")
                if c.share < 100 and c.policy == "force":
                    worst = max(worst, abs(got[c.name] - c.share))
        reclaims, after, alone = [], [], []
        for r in range(args.repeat):
            driver = make_gpu(work / f"reclaim{r}", args.sample_ms, resident_samples=args.resident)
            res = measure_reclaim(driver, work / f"reclaim-run{r}", Container("burster", 30, "default"),
                                  Container("neighbour", 70, "force"), alone=args.settle + 1, together=3.0,
                                  workload=workload)
            driver.close()
            reclaims.append(res.reclaim_s)
            after.append(res.after)
            alone.append(res.alone)
        done = [r for r in reclaims if r is not None]
        print(f"default gives back: 30 % container alone used {statistics.median(alone):.1f} %; after a 70 % "
              f"neighbour started, the neighbour had its share after {statistics.median(done) * 1000:.0f} ms "
              f"(median of {len(done)}, worst {max(done) * 1000:.0f} ms; {len(reclaims) - len(done)} never); then "
              f"{statistics.median(a['burster'] for a in after):.1f} % + "
              f"{statistics.median(a['neighbour'] for a in after):.1f} %" if done else
              f"default never gave back within 3 s: {reclaims}")
        print(f"worst deviation from a share under force: {worst:.1f} points")
        results.update({"reclaim_s": reclaims, "alone_default": alone, "after_reclaim": after,
                        "worst_force_deviation": round(worst, 1)})
        print(json.dumps(results))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if worst <= 5 and len(done) == len(reclaims) else 1


if __name__ == "__main__":
    raise SystemExit(main())
