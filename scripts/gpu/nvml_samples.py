"""What NVML reports per process when processes share one GPU, and when a PyTorch process appears in NVML's
process list: the readings the compute share is built on, recorded raw.

    python scripts/gpu/nvml_samples.py

1. Two spin processes without the shim, the second started 2 s after the first, then the same with the second
   under the shim at a 30 % share (force). Every 100 ms this process reads nvmlDeviceGetProcessUtilization with
   the newest timestamp it has seen (as the shim's controller does) and nvmlDeviceGetUtilizationRates.
2. A PyTorch child lists NVML's compute processes at each step of its start (import, cuda init, first tensor,
   first matmul), without the shim and under it (its log at debug level).
Results: nvml_samples.jsonl (raw) and one verdict line per reading: per-process samples seen for every process
that runs kernels, and the PyTorch process listed once it holds a context.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report, save, shim_env  # noqa: E402
from spin_share import build  # noqa: E402

CYCLES = "2000000"


def sample_while(procs: list[subprocess.Popen], handle, seconds: float) -> list[dict]:
    import pynvml

    seen, rows, end = 0, [], time.monotonic() + seconds
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        t = time.monotonic()
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, seen)
        except pynvml.NVMLError as e:
            samples, err = [], str(e)
        else:
            err = ""
        gpu = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        listed = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        raw = [{"pid": s.pid, "ts": s.timeStamp, "sm": s.smUtil} for s in samples]
        seen = max([seen] + [s["ts"] for s in raw])
        rows.append({"t": round(t, 3), "gpu": gpu, "listed": listed, "samples": raw, "err": err})
        time.sleep(0.1)
    return rows


def per_pid(rows: list[dict], pids: list[int]) -> dict:
    out = {}
    for pid in pids:
        sms = [s["sm"] for r in rows for s in r["samples"] if s["pid"] == pid]
        out[str(pid)] = {"samples": len(sms), "mean_sm": round(sum(sms) / len(sms), 1) if sms else None}
    return out


def spin_pair(exe: str, work: Path, second_env: dict[str, str], handle) -> tuple[list[dict], dict, str]:
    argv = [exe, "10", CYCLES, "100"]
    a = subprocess.Popen(argv, env=shim_env(work / "a", shim=False), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    b = subprocess.Popen(argv, env=second_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows = sample_while([a, b], handle, 12)
    out_b, err_b = b.communicate(timeout=30)
    a.communicate(timeout=30)
    share = next((json.loads(x) for x in out_b.splitlines() if '"share"' in x), {})
    return rows, {"first": a.pid, "second": b.pid, "share_of_second": share, **per_pid(rows, [a.pid, b.pid])}, err_b


TORCH_CHILD = r"""
import json, os, sys, pynvml
pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
def step(name):
    listed = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    print(json.dumps({"step": name, "pid": os.getpid(), "listed": listed, "me_listed": os.getpid() in listed}),
          flush=True)
step("start")
import torch
step("import torch")
torch.cuda.init()
step("torch.cuda.init")
x = torch.empty(1, device="cuda")
step("first tensor")
y = torch.randn(1024, 1024, device="cuda"); y @ y; torch.cuda.synchronize()
step("first matmul")
"""


def main() -> int:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    work = Path(tempfile.mkdtemp(prefix="gs-nvml-"))
    for d in ("a", "b", "c", "t1", "t2"):
        (work / d).mkdir()
    exe = str(build(work))
    records: list[dict] = []
    raw: list[dict] = []

    rows, summary, _ = spin_pair(exe, work, shim_env(work / "b", shim=False), handle)
    raw.append({"case": "two spin processes, no shim", "summary": summary, "rows": rows})
    both = all(summary[str(p)]["samples"] > 0 for p in (summary["first"], summary["second"]))
    records.append(report("NVML per-process samples for both of two unshimmed processes", both, summary))

    env = shim_env(work / "c", CUDA_DEVICE_SM_LIMIT=30, GPU_CORE_UTILIZATION_POLICY="force", LIBCUDA_LOG_LEVEL=4)
    rows, summary, err = spin_pair(exe, work, env, handle)
    raw.append({"case": "second under the shim at 30 % force", "summary": summary, "rows": rows,
                "shim_log": err[-20000:]})
    both = all(summary[str(p)]["samples"] > 0 for p in (summary["first"], summary["second"]))
    records.append(report("NVML per-process samples for a shimmed process beside an unshimmed one", both,
                          {**summary, "shim_log_tail": [m for m in err.splitlines() if "CUDA device" in m][-6:]}))

    for label, env in (("no shim", shim_env(work / "t1", shim=False)),
                       ("under the shim", shim_env(work / "t2", CUDA_DEVICE_SM_LIMIT=30,
                                                   GPU_CORE_UTILIZATION_POLICY="force", LIBCUDA_LOG_LEVEL=4))):
        proc = subprocess.run([sys.executable, "-c", TORCH_CHILD], env=env, capture_output=True, text=True,
                              timeout=120)
        steps = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        raw.append({"case": f"torch start, {label}", "steps": steps, "stderr": proc.stderr[-20000:]})
        first = next((s["step"] for s in steps if s["me_listed"]), None)
        records.append(report(f"PyTorch process listed by NVML [{label}]", first is not None,
                              {"first_listed_at": first, "steps": [(s["step"], s["me_listed"]) for s in steps],
                               "shim": [m for m in proc.stderr.splitlines() if "[gpushare]" in m][:8]}))

    records.append(report("where nvcc is", True, {"which": shutil.which("nvcc"), "CUDA_HOME": os.environ.get(
        "CUDA_HOME"), "usr_local_cuda": os.path.exists("/usr/local/cuda/bin/nvcc")}))
    save(records, "nvml_samples.jsonl")
    (Path(os.environ.get("OUT") or "/tmp/gpushare-gpu") / "nvml_raw.json").write_text(json.dumps(raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
