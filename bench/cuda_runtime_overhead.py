"""The shim's cost on real CUDA runtime calls: an nvcc-built program (bench/cuda/rt_bench.cu, static cudart)
over the fake driver, without and with the shim, in one run.

    .venv/bin/python bench/cuda_runtime_overhead.py [--repeat 5]

Cases: cudaMalloc + cudaFree of 1 MiB under an 8 GiB memory limit, cudaMallocAsync + cudaFreeAsync of 1 MiB under
a 36 GiB one;
an empty `<<<1, 32>>>` launch under a 50 % compute share with the GPU reading 10 % busy (the token bucket engaged,
with tokens). The fake driver makes each call nearly free, so what shows is the shim's own cost. Each case runs
alternately without and with the shim `--repeat` times; medians are compared, against a bound of 1.5x.
With --torch PYTHON it also runs PyTorch's caching allocator churn (tests/cuda/torch_probe.py `churn`: 10,000
tensors of mixed sizes) with that interpreter (a venv with torch, `make test-torch` makes .venv-torch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devplugin import contract  # noqa: E402
from devplugin_sim import cuda_toolkit  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver, FakeGPU  # noqa: E402

BUILD = REPO / "build"
SHIM = BUILD / "shim" / "test" / "libgpushare.so"  # the test build: it loads the fake drivers
FAKE_CUDA = BUILD / "fakes" / "libcuda.so.1"
FAKE_NVML = BUILD / "fakes" / "libnvidia-ml.so.1"
BOUND = 1.5

CASES = {
    "cudaMalloc + cudaFree 1 MiB": ("malloc", 200000, {contract.ENV_MEMORY_LIMIT: "8g"}),
    # the shim gives a stream-ordered free's charge back from a host function behind it: a tight loop may run
    # ahead of them by up to n x 2 MiB, which the limit leaves room for
    "cudaMallocAsync + cudaFreeAsync 1 MiB": ("async", 10000, {contract.ENV_MEMORY_LIMIT: "36g"}),
    "<<<1, 32>>> launch": ("launch", 2000000, {contract.ENV_SM_LIMIT: "50"}),
}


def base_env(driver: FakeDriver, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "GPUSHARE_", "GPU_CORE_", "FAKE_", "LD_PRELOAD"))}
    env.update(driver.env())
    env.update({
        contract.ENV_REAL_LIBCUDA: str(FAKE_CUDA), contract.ENV_REAL_LIBNVML: str(FAKE_NVML),
        contract.ENV_SHARED_CACHE: str(work / "usage.cache"), contract.ENV_CONTEXT_RESERVE: "0",
        contract.ENV_GPU_LOCK_DIR: str(work),
    })
    return env


def one(cmd: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--torch", metavar="PYTHON", help="an interpreter with torch, for the allocator churn")
    args = ap.parse_args()
    program = cuda_toolkit.build(REPO / "bench" / "cuda" / "rt_bench.cu", BUILD / "cuda" / "rt_bench_static",
                                 "static")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="gs-rtbench-") as tmp:
        work = Path(tmp)
        gpu = FakeGPU(index=0, uuid="GPU-4b1f6c2e-0000-4000-8000-0000000000a1", name="NVIDIA A100-SXM4-40GB",
                      memory_mib=40960, minor=0, pci_bus_id="00000000:07:00.0", sms=108, compute_capability=(8, 0))
        driver = FakeDriver.create(work / "node", [gpu])
        driver.set_utilization(0, 10)
        print(f"{'call':40} {'no shim':>10} {'shim':>10} {'ratio':>6}  (median of {args.repeat}, ns per call)")
        for name, (case, n, settings) in CASES.items():
            env = {**base_env(driver, work), **settings}
            plain, shim = [], []
            for _ in range(args.repeat):
                plain.append(one([str(program), case, str(n)], env)["ns"])
                shim.append(one([str(program), case, str(n)], {**env, "LD_PRELOAD": str(SHIM)})["ns"])
            a, b = statistics.median(plain), statistics.median(shim)
            worst = max(worst, b / a)
            print(f"{name:40} {a:10.1f} {b:10.1f} {b / a:6.2f}")
        if args.torch:
            probe = REPO / "tests" / "cuda" / "torch_probe.py"
            env = {**base_env(driver, work), contract.ENV_MEMORY_LIMIT: "8g", "FAKE_CUDA_HOST_BACKED": "1"}
            plain, shim = [], []
            for _ in range(args.repeat):
                plain.append(one([args.torch, str(probe), "init", "churn", "10000"], env)["seconds"])
                shim.append(one([args.torch, str(probe), "init", "churn", "10000"],
                                {**env, "LD_PRELOAD": str(SHIM)})["seconds"])
            a, b = statistics.median(plain), statistics.median(shim)
            print(f"{'PyTorch churn, 10,000 tensors (ms)':40} {a * 1e3:10.1f} {b * 1e3:10.1f} {b / a:6.2f}")
        driver.close()
    print(f"worst runtime-call ratio {worst:.2f} (bound {BOUND})")
    return 0 if worst <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
