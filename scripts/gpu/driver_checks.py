"""The memory cap and the virtual view on the real driver, without PyTorch: gs_probe (shim/tests) reaches the
real libcuda.so.1 through cuGetProcAddress_v2 (plain and per-thread-stream) and dlsym, under a 2 GiB limit;
nvidia-smi under the shim shows the slice; and the size of a real CUDA context is measured, to check the
shim's default GPUSHARE_CONTEXT_RESERVE.

    python scripts/gpu/driver_checks.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PROBE, GiB, MiB, report, run_json, save, shim_env  # noqa: E402

LIMIT = 2 * GiB
RESERVE = 256 * MiB  # the shim's default context charge


def real(env: dict[str, str]) -> dict[str, str]:
    return {**env, "GS_PROBE_LIBCUDA": "libcuda.so.1", "GS_PROBE_LIBNVML": "libnvidia-ml.so.1"}


def fill_checks(work: Path) -> list[dict]:
    records = []
    for mode in ("gpa", "gpa-ptsz", "dlsym"):
        for kind in ("alloc", "async", "create", "managed"):
            env = real(shim_env(work, CUDA_DEVICE_MEMORY_LIMIT=LIMIT))
            lines, stderr = run_json([str(PROBE), mode, "init", "ctx", "0", "meminfo", "fill", kind, "64m",
                                      "meminfo", "freeall", "meminfo"], env)
            steps = [line for line in lines if "op" in line]
            ops = {(s["op"], i): s for i, s in enumerate(steps)}
            fill = next((s for s in steps if s["op"] == "fill"), {})
            infos = [s for s in steps if s["op"] == "meminfo"]
            ok = (fill.get("rc") == 2 and fill.get("bytes") == LIMIT - RESERVE and len(infos) == 3
                  and all(i["total"] == LIMIT for i in infos) and infos[0]["free"] == LIMIT - RESERVE
                  and infos[1]["free"] == 0 and infos[2]["free"] == LIMIT - RESERVE)
            records.append(report(f"real driver: {kind} through {mode} stops at the limit", ok,
                                  {"steps": list(ops.values()), "stderr": stderr[-500:]}))
    return records


def context_size(work: Path) -> dict:
    """Device memory a bare CUDA context takes, as nvidia-smi reports it for the process."""
    proc = subprocess.Popen([str(PROBE), "gpa", "init", "ctx", "0", "ready"], env=real(shim_env(work, shim=False)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        while "ready" not in (proc.stdout.readline() or "ready"):
            pass
        time.sleep(1)
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60).stdout
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    used = [int(fields[1]) for fields in (line.split(", ") for line in out.splitlines()) if fields[0] == str(proc.pid)]
    return report("context size measured (compare with GPUSHARE_CONTEXT_RESERVE, 256 MiB)", bool(used),
                  {"context_mib": used[0] if used else None, "nvidia_smi": out[-500:]})


def nvidia_smi_view(work: Path) -> list[dict]:
    if not shutil.which("nvidia-smi"):
        return [report("nvidia-smi under the shim", False, {"error": "nvidia-smi not found"})]
    query = ["nvidia-smi", "--query-gpu=index,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"]
    env = real(shim_env(work, CUDA_DEVICE_MEMORY_LIMIT_0=LIMIT))
    holder = subprocess.Popen([str(PROBE), "gpa", "init", "ctx", "0", "alloc", "512m", "ready"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        while "ready" not in (holder.stdout.readline() or "ready"):
            pass
        rows = subprocess.run(query, env=env, capture_output=True, text=True, timeout=60)
        table = subprocess.run(["nvidia-smi"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    first = rows.stdout.splitlines()[0].split(", ") if rows.stdout else []
    ok = len(first) == 4 and int(first[1]) == LIMIT // MiB and int(first[2]) == (512 * MiB + RESERVE) // MiB
    return [report("nvidia-smi under the shim shows the 2 GiB slice and what the container uses", ok,
                   {"query": rows.stdout + rows.stderr[-500:], "table": table.stdout})]


def main() -> int:
    if not PROBE.exists():
        raise SystemExit(f"{PROBE} is missing: run `make native` first")
    work = Path(tempfile.mkdtemp(prefix="gs-driver-"))
    records = fill_checks(work) + [context_size(work)] + nvidia_smi_view(work)
    save(records, "driver_checks.jsonl")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
