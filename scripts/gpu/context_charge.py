"""Measure what a CUDA context really takes on this GPU, to set the shim's per-process context charge.

    python scripts/gpu/context_charge.py [--gpu 0] [--samples 3]

The shim charges each process GPUSHARE_CONTEXT_RESERVE (default 256 MiB) for its context on a GPU, because the
driver takes that memory outside any allocation call. How much it takes depends on the GPU, the driver and
CUDA_MODULE_LOADING. For each sample a fresh process (gs_probe, without the shim) retains the GPU's primary
context and holds it; the GPU's used memory from NVML while it holds it, minus before, is the context. Run it on
an idle GPU (memory other processes take meanwhile is counted too); the largest sample, rounded up to the
driver's 2 MiB granularity, is the value to set (DaemonSet env GPUSHARE_CONTEXT_RESERVE, or per container).
Results: one JSON line per setting and the recommendation, also in $OUT/context_charge.jsonl.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PROBE, MiB, report, save  # noqa: E402

GRANULE = 2 * MiB


def used_bytes(gpu: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).used)
    finally:
        pynvml.nvmlShutdown()


def one_sample(gpu: int, env: dict[str, str]) -> int:
    """Bytes the GPU's used memory grows by while one process holds a context on it."""
    before = used_bytes(gpu)
    proc = subprocess.Popen([str(PROBE), "gpa", "init", "ctx", str(gpu), "ready"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if '"op":"ready"' in line:
                break
            if '"rc":0' not in line:
                raise SystemExit(f"gs_probe could not create a context: {line.strip()} {proc.stderr.read()}")
        time.sleep(0.5)  # NVML's memory figure follows the driver's
        during = used_bytes(gpu)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return max(0, during - before)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index = CUDA ordinal of the GPU (default 0)")
    parser.add_argument("--samples", type=int, default=3, help="contexts measured per setting (default 3)")
    args = parser.parse_args()
    if not PROBE.exists():
        raise SystemExit(f"{PROBE} is missing: run `make native` first")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "GPUSHARE_", "CUDA_DEVICE_"))}
    records, largest = [], 0
    for loading in ("LAZY", "EAGER"):
        env = dict(base, CUDA_MODULE_LOADING=loading)
        samples = [one_sample(args.gpu, env) for _ in range(max(1, args.samples))]
        largest = max(largest, *samples)
        records.append(report(f"context size with CUDA_MODULE_LOADING={loading}", all(s > 0 for s in samples),
                              {"samples_mib": [round(s / MiB, 1) for s in samples]}))
    recommended = (largest + GRANULE - 1) // GRANULE * GRANULE
    records.append(report("recommended GPUSHARE_CONTEXT_RESERVE", recommended > 0,
                          {"bytes": recommended, "setting": f"GPUSHARE_CONTEXT_RESERVE={recommended // MiB}m"}))
    save(records, "context_charge.jsonl")
    return 0 if recommended > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
