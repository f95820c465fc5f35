"""Per-call cost of the isolation shim, against the fake driver: shim versus no shim in one run, as ratios.

    .venv/bin/python bench/shim_overhead.py [--repeat 5]

- cuLaunchKernel below the compute share (a 50 % share, the GPU reading 10 % busy: the token bucket is engaged
  but has tokens), reached through cuGetProcAddress_v2 as the CUDA runtime reaches it;
- a 1 MiB cuMemAlloc_v2 + cuMemFree_v2 pair under an 8 GiB memory limit.
Each case runs `build/shim/bench/gs_bench` alternately without and with the shim, `--repeat` times; the
medians are compared. It then checks two behaviours the reference shim gets wrong (a per-thread-stream launch
reaches the driver's _ptsz entry point and is throttled; cuMemAllocAsync over the limit is out of memory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devplugin import contract  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver, FakeGPU  # noqa: E402

BUILD = REPO / "build"
SHIM = BUILD / "shim" / "test" / "libgpushare.so"  # the test build: it loads the fake drivers
BENCH = BUILD / "shim" / "bench" / "gs_bench"
PROBE = BUILD / "shim" / "tests" / "gs_probe"
FAKE_CUDA = BUILD / "fakes" / "libcuda.so.1"
FAKE_NVML = BUILD / "fakes" / "libnvidia-ml.so.1"

CASES = {
    "launch": (["launch", "50000000"], {"CUDA_DEVICE_SM_LIMIT": "50"}),
    "alloc+free 1 MiB": (["alloc", "2000000", str(1 << 20)], {"CUDA_DEVICE_MEMORY_LIMIT": "8g"}),
}


def base_env(driver: FakeDriver, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPUSHARE_", "LD_PRELOAD"))}
    env.update(driver.env())
    env.update({
        "GS_PROBE_LIBCUDA": str(FAKE_CUDA), "GS_PROBE_LIBNVML": str(FAKE_NVML),
        contract.ENV_REAL_LIBCUDA: str(FAKE_CUDA), contract.ENV_REAL_LIBNVML: str(FAKE_NVML),
        contract.ENV_SHARED_CACHE: str(work / "usage.cache"), contract.ENV_CONTEXT_RESERVE: "0",
    })
    return env


def run_bench(args: list[str], env: dict[str, str]) -> float:
    out = subprocess.run([str(BENCH), *args], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise SystemExit(f"gs_bench {' '.join(args)} failed: {out.stderr}")
    return float(json.loads(out.stdout)["ns_per_call"])


def probe(env: dict[str, str], mode: str, *steps: str) -> list[dict]:
    out = subprocess.run([str(PROBE), mode, *steps], env=env, capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    missing = [p for p in (SHIM, BENCH, PROBE, FAKE_CUDA, FAKE_NVML) if not p.exists()]
    if missing:
        raise SystemExit(f"not built: {', '.join(map(str, missing))}; run `make native`")
    work = Path(tempfile.mkdtemp(prefix="gsbench-shim-", dir="/tmp"))
    gpu = FakeGPU(index=0, uuid="GPU-0badc0de-0000-4000-8000-000000000001", name="NVIDIA H100 80GB HBM3",
                  memory_mib=81920, minor=0, pci_bus_id="00000000:01:00.0", sms=132)
    driver = FakeDriver.create(work / "node", [gpu])
    driver.set_utilization(0, 10)
    env = base_env(driver, work)

    print(f"shim per-call overhead against the fake driver, median of {args.repeat} runs (ns per call)")
    print(f"{'case':<20}{'no shim':>10}{'shim':>10}{'ratio':>8}")
    results = {}
    for name, (bench_args, settings) in CASES.items():
        plain, shimmed = [], []
        for _ in range(args.repeat):
            plain.append(run_bench(bench_args, env))
            shimmed.append(run_bench(bench_args, {**env, **settings, "LD_PRELOAD": str(SHIM)}))
        a, b = statistics.median(plain), statistics.median(shimmed)
        results[name] = {"no_shim_ns": round(a, 2), "shim_ns": round(b, 2), "ratio": round(b / a, 2)}
        print(f"{name:<20}{a:>10.2f}{b:>10.2f}{b / a:>8.2f}")

    # Kernels now take time and the process keeps the GPU busy: a 20 % share must hold its launches back. A
    # container of its own (its own usage file): the bucket of the cases above learnt a rate for launches that
    # take no GPU time.
    shim_env = {**env, "LD_PRELOAD": str(SHIM), "CUDA_DEVICE_SM_LIMIT": "20", "CUDA_DEVICE_MEMORY_LIMIT": "1g",
                contract.ENV_SHARED_CACHE: str(work / "usage-throttled.cache"),
                "GPU_CORE_UTILIZATION_POLICY": "force", "FAKE_CUDA_NS_PER_BLOCK": "1000", "FAKE_CUDA_QUEUE_US": "20000"}
    steps = probe(shim_env, "gpa-ptsz", "init", "ctx", "0", "launchfor", "launch", "600", "100", "counters", "stats",
                  "0", "async", "768m", "async", "512m")
    launched, counters, stats, async_ok, async_over = steps[2], steps[3], steps[4], steps[5], steps[6]
    ptsz_ok = counters["launch_ptsz"] == launched["n"] and counters["launch"] == 0 and stats["waits"] > 0
    oom_ok = async_ok["rc"] == 0 and async_over["rc"] == 2
    print(f"per-thread-stream launch via cuGetProcAddress_v2 reaches cuLaunchKernel_ptsz, throttled: "
          f"{'yes' if ptsz_ok else 'NO'} ({counters['launch_ptsz']} _ptsz calls, {stats['waits']} waits)")
    print(f"cuMemAllocAsync over the limit returns CUDA_ERROR_OUT_OF_MEMORY: {'yes' if oom_ok else 'NO'} "
          f"(rc {async_over['rc']})")
    print(json.dumps({"overhead": results, "ptsz_launch_throttled": ptsz_ok, "async_oom": oom_ok}))
    driver.close()
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ptsz_ok and oom_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
