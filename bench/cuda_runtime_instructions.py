"""The shim's cost on real CUDA runtime calls in instructions, which the machine's load does not move: the program of
bench/cuda_runtime_overhead.py (bench/cuda/rt_bench.cu, static cudart, over the fake driver) under valgrind's
callgrind, once with N and once with 2N calls, so that start-up cancels out.

    .venv/bin/python bench/cuda_runtime_instructions.py [--shim PATH ...] [--n 20000]

Each --shim is a build of the library to compare (default: the tests' build, build/shim/test/libgpushare.so); a build
of an earlier commit gives the cost of a change. Prints instructions per call (a cudaMalloc + cudaFree pair, a
cudaMallocAsync + cudaFreeAsync pair, a launch), without the shim and with each build.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.cuda_runtime_overhead import BUILD, CASES, SHIM, base_env  # noqa: E402
from devplugin_sim import cuda_toolkit  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver, FakeGPU  # noqa: E402


def instructions(program: Path, case: str, n: int, env: dict[str, str]) -> int:
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", str(program), case,
                          str(n)], env=env, capture_output=True, text=True, timeout=1800)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"{program.name} {case} {n} under callgrind failed: {out.stderr[-2000:]}")
    return int(found.group(1))


def per_call(program: Path, case: str, n: int, env: dict[str, str]) -> float:
    return (instructions(program, case, 2 * n, env) - instructions(program, case, n, env)) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", action="append", type=Path, help="a build of libgpushare.so (repeatable)")
    ap.add_argument("--n", type=int, default=20000, help="calls in the shorter run (default 20000)")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    shims = args.shim or [SHIM]
    program = cuda_toolkit.build(REPO / "bench" / "cuda" / "rt_bench.cu", BUILD / "cuda" / "rt_bench_static",
                                 "static")
    with tempfile.TemporaryDirectory(prefix="gs-rtinstr-") as tmp:
        work = Path(tmp)
        gpu = FakeGPU(index=0, uuid="GPU-4b1f6c2e-0000-4000-8000-0000000000a1", name="NVIDIA A100-SXM4-40GB",
                      memory_mib=40960, minor=0, pci_bus_id="00000000:07:00.0", sms=108, compute_capability=(8, 0))
        driver = FakeDriver.create(work / "node", [gpu])
        driver.set_utilization(0, 10)
        print(f"{'call':40} {'no shim':>10} " + " ".join(f"{'shim ' + str(i + 1):>10}" for i in range(len(shims)))
              + "  (instructions per call)")
        for name, (case, _, settings) in CASES.items():
            env = {**base_env(driver, work), **settings}
            row = [per_call(program, case, args.n, env)]
            row += [per_call(program, case, args.n, {**env, "LD_PRELOAD": str(s)}) for s in shims]
            print(f"{name:40} " + " ".join(f"{v:10.1f}" for v in row))
        driver.close()
    for i, s in enumerate(shims):
        print(f"shim {i + 1}: {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
