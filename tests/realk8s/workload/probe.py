"""What a workload sees of its GPUs, printed from inside a pod's container as one JSON line, then waits.

The test cluster's `workload` image runs it as its entrypoint (tests/realk8s/images.py). It reports: the GPU
environment (NVIDIA_VISIBLE_DEVICES, the shim's CUDA_DEVICE_* limits, ...), whether the shim is preloaded
(/etc/ld.so.preload and what it names), the limits file, the device nodes (/dev/nvidia*), what NVML says (GPUs by
UUID and name, total / used / free memory: what nvidia-smi shows) and what NVIDIA's CUDA runtime says (device count,
each device's total and free memory: cudaMemGetInfo), through the CUDA runtime probe (tests/cuda/rt_probe.cu, built
against static cudart) and nvidia-smi itself. Extra arguments are steps run after the view (`--then STEP ...` for
the CUDA runtime probe). SIGTERM ends it with exit code 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOOLS = Path(os.environ.get("GPUSHARE_TEST_TOOLS", "/opt/gpushare-test"))
RT_PROBE = TOOLS / "rt_probe_static"
GPU_ENV_PREFIXES = ("NVIDIA_", "CUDA_", "GPU_", "ALIYUN_COM_GPU", "GPUSHARE_", "LD_PRELOAD", "FAKE_")


def _run(cmd: list[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except FileNotFoundError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s"


def runtime_view() -> dict[str, Any]:
    """NVIDIA's CUDA runtime: device count, memory of device 0 (cudaMemGetInfo), NVML through the probe."""
    if not Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1").exists():
        return {"driver": False}
    rc, out, err = _run([str(RT_PROBE), "init", "meminfo", "nvml"])
    steps = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {"driver": True, "rc": rc, "steps": steps, "stderr": err[-2000:]}


def nvml_view() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError as e:
        return {"error": f"pynvml: {e}"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"error": str(e)}
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append({"index": i, "uuid": pynvml.nvmlDeviceGetUUID(h), "name": pynvml.nvmlDeviceGetName(h),
                         "total": mem.total, "used": mem.used, "free": mem.free})
        return {"gpus": gpus}
    finally:
        pynvml.nvmlShutdown()


def smi_view() -> dict[str, Any]:
    rc, out, err = _run(["nvidia-smi", "--query-gpu=index,uuid,memory.total,memory.used,memory.free",
                         "--format=csv,noheader,nounits"])
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    return {"rc": rc, "rows": rows, "stderr": err.strip()[-500:]}


def view() -> dict[str, Any]:
    preload = Path("/etc/ld.so.preload")
    limits = Path("/etc/gpushare/limits")
    return {
        "hostname": os.uname().nodename,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(GPU_ENV_PREFIXES)},
        "preload": preload.read_text().split() if preload.exists() else None,
        "shim_loaded": preload.exists() and any(Path(p).exists() for p in preload.read_text().split()),
        "limits": limits.read_text() if limits.exists() else None,
        "devices": sorted(p.name for p in Path("/dev").glob("nvidia*")),
        "nvml": nvml_view(),
        "runtime": runtime_view(),
        "smi": smi_view(),
    }


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"probe": view()}), flush=True)
    if argv[:1] == ["--then"] and argv[1:]:
        rc, out, err = _run([str(RT_PROBE), *argv[1:]], timeout=600)
        steps = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        print(json.dumps({"then": {"rc": rc, "steps": steps, "stderr": err[-2000:]}}), flush=True)
    if os.environ.get("PROBE_EXIT") is not None:
        return int(os.environ["PROBE_EXIT"])
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
