"""NVIDIA's CUDA runtime under the shim on a share of two GPUs, on the real driver: tests/cuda/rt_probe.cu built
with static and with shared cudart (the toolkit the test extra installs from PyPI), 2 GiB on GPU 0 and 3 GiB on
GPU 1. The runtime must start (it loads the program's kernel images as libraries before any context is current),
see both GPUs, show each at its own limit less the context charge, and charge 512 MiB allocated on GPU 1 to GPU 1
alone. A machine with one GPU skips the check.

    python scripts/gpu/runtime_devices.py

Results in $OUT/runtime_devices.jsonl.
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, GiB, MiB, report, run_json, save, shim_env  # noqa: E402

sys.path.insert(0, str(REPO))
from devplugin_sim import cuda_toolkit  # noqa: E402

LIMITS = (2 * GiB, 3 * GiB)
RESERVE = 256 * MiB  # the shim's default context charge, once per process and GPU
HELD = 512 * MiB


def gpu_count(probe: Path, work: Path) -> int:
    lines, _ = run_json([str(probe), "count"], shim_env(work, shim=False))
    return next((line["count"] for line in lines if line.get("op") == "count"), 0)


def check(probe: Path, cudart: str, work: Path) -> dict:
    env = shim_env(work, CUDA_VISIBLE_DEVICES="0,1",
                   **{f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{size >> 20}m" for i, size in enumerate(LIMITS)})
    steps_asked = ["init", "count", "meminfo", "device", 1, "meminfo", "alloc", HELD >> 20, "meminfo", "device", 0,
                   "meminfo"]
    lines, stderr = run_json([str(probe), *map(str, steps_asked)], env)
    steps = [line for line in lines if "op" in line]
    views = [(s["free"], s["total"]) for s in steps if s["op"] == "meminfo"]
    room = [size - RESERVE for size in LIMITS]
    want = [(room[0], LIMITS[0]), (room[1], LIMITS[1]), (room[1] - HELD, LIMITS[1]), (room[0], LIMITS[0])]
    ok = ([s["op"] for s in steps] == [op for op in steps_asked if isinstance(op, str)]
          and all(s["error"] == "cudaSuccess" for s in steps) and steps[1]["count"] == 2 and views == want)
    return report(f"runtime ({cudart} cudart) on two GPUs under the shim: each at its own limit, GPU 1's "
                  "allocation charged to GPU 1", ok, {"steps": steps, "want_meminfo": want, "stderr": stderr[-500:]})


def nvml_gpus() -> int:
    """GPUs NVML counts, asked before anything is built (a machine with one needs no toolkit for this check)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    count = ctypes.c_uint(0)
    if nvml.nvmlInit_v2() != 0 or nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return 0
    return count.value


def main() -> int:
    if nvml_gpus() < 2:
        print("SKIP runtime_devices: this machine has fewer than two GPUs", flush=True)
        return 0
    work = Path(tempfile.mkdtemp(prefix="gs-runtime-devices-"))
    try:
        probes = {cudart: cuda_toolkit.build(REPO / "tests" / "cuda" / "rt_probe.cu",
                                             work / f"rt_probe_{cudart}", cudart) for cudart in ("static", "shared")}
    except cuda_toolkit.ToolkitError as e:
        records = [report("runtime on two GPUs under the shim", False, {"error": str(e)})]
        save(records, "runtime_devices.jsonl")
        return 1
    if gpu_count(probes["static"], work) < 2:
        print("SKIP runtime_devices: this machine has fewer than two GPUs", flush=True)
        return 0
    records = [check(probe, cudart, work) for cudart, probe in probes.items()]
    save(records, "runtime_devices.jsonl")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
