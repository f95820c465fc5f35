"""A paid compute share beside containers that reserved none, on one simulated GPU of a core_mem node.

    .venv/bin/python bench/unreserved_share.py [--grid 132] [--settle 3] [--window 4] [--neighbours 1,2,4,8]

The node daemon's allocator places a 70 % container (8 GiB) and N containers asking for 4 GiB of gpu-mem and no
gpu-core.percentage on the one GPU of a core_mem node, and writes each one's limits file; every container is one
`build/shim/tests/gs_probe` process launching kernels of GRID blocks x 1 us back to back under `libgpushare.so`
with that limits file (the daemon's policy: `default`). The fake driver runs every process's kernels on one shared
timeline, time-sliced between busy processes about evenly as a GPU is; what each container got is read from the
timeline after --settle seconds, over --window seconds, with the GPU's busy share (all containers together: well
below 100 % means the processes were short of CPU, not of GPU time). Two orders: the paid container placed first (its
neighbours' limits cap them at the 30 % nobody reserved) and last (they were placed on a GPU nobody had reserved
any of: cap 100).

Then arrivals: the 70 % container runs alone and N memory-only containers start beside it, or they run alone
(bursting into the idle GPU) and it starts beside them; the 70 % container's lowest 100 ms tick over the next
3 s, and from when it has had >= 65 % in two consecutive ticks (--repeat runs of each).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devplugin_sim.gpu_share import Run, Workload, make_gpu, measure_steady, shares  # noqa: E402
from devplugin_sim.placed_share import paid_beside_memory_only  # noqa: E402

PAID = 70
KEEPS = 65


def arrival(work: Path, n: int, workload: Workload, alone: float, together: float, paid_arrives: bool
            ) -> tuple[float | None, tuple[float, float]]:
    """The paid container runs alone and `n` memory-only neighbours start beside it, or (`paid_arrives`) they run
    alone, bursting into the idle GPU, and it starts beside them. (Seconds from then until the paid container has
    had >= KEEPS in two consecutive ticks, or None; (its lowest tick, the GPU's busy share in that tick))."""
    driver = make_gpu(work / "node")
    try:
        placed = paid_beside_memory_only(work / "state", driver.gpus[0].uuid, PAID, n, paid_first=not paid_arrives)
        first = [c for c in placed if (c.name == "paid") != paid_arrives]
        later = [c for c in placed if c not in first]
        run = Run(driver, work / "run", workload, alone + together + 0.5)
        try:
            for c in first:
                run.start(c)
            time.sleep(alone)
            for c in later:
                run.start(c, seconds=together)
            start = prev_t = time.monotonic()
            prev = run.busy()
            trace = []
            while time.monotonic() - start < together - 0.1:
                time.sleep(0.1)
                now_t, now = time.monotonic(), run.busy()
                got = shares(prev, now, now_t - prev_t)
                trace.append((now_t - start, got["paid"], sum(got.values())))
                prev_t, prev = now_t, now
            run.finish()
        finally:
            run.stop()
    finally:
        driver.close()
    back = next((trace[i - 1][0] for i in range(1, len(trace))
                 if trace[i - 1][1] >= KEEPS and trace[i][1] >= KEEPS), None)
    low = min(trace, key=lambda t: t[1])
    return back, (low[1], low[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=132, help="blocks per kernel (1 us each)")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--neighbours", default="1,2,4,8", help="numbers of memory-only containers to try")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the neighbours' start")
    args = parser.parse_args()
    counts = [int(n) for n in args.neighbours.split(",")]
    workload = Workload(grid=args.grid)
    work = Path(tempfile.mkdtemp(prefix="gsbench-unreserved-", dir="/tmp"))
    results: dict[str, object] = {"grid": args.grid, "window_s": args.window, "steady": {}, "start": {}}
    print(f"a {PAID} % container beside N containers that reserved no compute, one simulated GPU, kernels of "
          f"{args.grid} blocks x 1 us, measured over {args.window:g} s after {args.settle:g} s")
    print(f"{'N':>3}  {'placed':<12}{'paid got':>9}{'GPU busy':>9}   each memory-only got")
    worst = 100.0
    try:
        for n in counts:
            for paid_first in (True, False):
                tag = f"n{n}-{'first' if paid_first else 'last'}"
                driver = make_gpu(work / tag / "node")
                try:
                    containers = paid_beside_memory_only(work / tag / "state", driver.gpus[0].uuid, PAID, n,
                                                         paid_first)
                    got = measure_steady(driver, work / tag / "run", containers, args.settle, args.window,
                                         workload)
                finally:
                    driver.close()
                rest = [round(v, 1) for k, v in got.items() if k != "paid"]
                worst = min(worst, got["paid"])
                busy = sum(got.values())  # well below 100: the processes lacked CPU, not GPU time
                results["steady"][tag] = {"paid": round(got["paid"], 1), "memory_only": rest,  # type: ignore[index]
                                          "gpu_busy": round(busy, 1)}
                print(f"{n:>3}  {'paid first' if paid_first else 'paid last':<12}{got['paid']:>8.1f}%{busy:>8.1f}%   "
                      + " + ".join(f"{v:.1f}" for v in rest) + " %")
        for paid_arrives in (False, True):
            for n in counts:
                runs = [arrival(work / f"start-{paid_arrives}-{n}-{r}", n, workload, alone=2.0, together=3.0,
                                paid_arrives=paid_arrives) for r in range(args.repeat)]
                back = [b for b, _ in runs if b is not None]
                lowest = [low for _, (low, _) in runs]
                worst_tick = min((tick for _, tick in runs), key=lambda t: t[0])
                results["start"][f"n{n}-{'paid' if paid_arrives else 'memory-only'}-arrives"] = {  # type: ignore
                    "back_s": [b for b, _ in runs], "lowest": [list(t) for _, t in runs]}
                since = (f"{statistics.median(back) * 1000:.0f} ms (median of {len(runs)}, worst "
                         f"{max(back) * 1000:.0f} ms{'' if len(back) == len(runs) else ', some never'})"
                         if back else "never")
                if paid_arrives:  # its first ticks hold its own start: what counts is when it has its share
                    print(f"the {PAID} % one starts beside {n} busy memory-only container(s): >= {KEEPS} % in two "
                          f"consecutive 100 ms ticks after {since}")
                else:
                    print(f"{n} memory-only container(s) start beside the busy {PAID} % one: its lowest 100 ms tick "
                          f"{worst_tick[0]:.1f} % (GPU busy {worst_tick[1]:.1f} % then; median of {len(runs)} runs "
                          f"{statistics.median(lowest):.1f} %)")
        print(f"lowest steady share of the {PAID} % container: {worst:.1f} %")
        results["worst_paid"] = round(worst, 1)
        print(json.dumps(results))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if worst >= KEEPS else 1


if __name__ == "__main__":
    raise SystemExit(main())
