"""The compute share without PyTorch: a spinning PTX kernel (spin_share.c) at a 30 % share runs at 25-35 % of its
unthrottled rate, and at 100 % under the shim at full rate.

    python scripts/gpu/spin_share.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, report, run_json, save, shim_env  # noqa: E402

SECONDS = 12
SETTLE = 4
SHARE = 30


def build(work: Path) -> Path:
    exe = work / "spin_share"
    subprocess.run(["cc", "-O2", "-I", str(REPO / "shim"), "-o", str(exe), str(Path(__file__).with_suffix(".c")),
                    "-ldl"], check=True)
    return exe


def rate(lines: list[dict]) -> float:
    per_second = [line["kernels"] for line in lines if line.get("op") == "second"][SETTLE:]
    return sum(per_second) / len(per_second) if per_second else 0.0


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="gs-spin-"))
    argv = [str(build(work)), str(SECONDS)]
    free_lines, free_err = run_json(argv, shim_env(work, shim=False))
    full_lines, _ = run_json(argv, shim_env(work, CUDA_DEVICE_SM_LIMIT=100))
    held_lines, stderr = run_json(argv, shim_env(work, CUDA_DEVICE_SM_LIMIT=SHARE,
                                                 GPU_CORE_UTILIZATION_POLICY="force"))
    free, full, held = rate(free_lines), rate(full_lines), rate(held_lines)
    ratio = held / free if free else 0.0
    records = [
        report("spin kernels at 100 % under the shim run at full rate", free > 0 and full >= 0.95 * free,
               {"no_shim_per_s": free, "shim_100_per_s": full, "no_shim_stderr": free_err[-500:]}),
        report(f"spin kernels at {SHARE} % run at 25-35 % of full rate", 0.25 <= ratio <= 0.35,
               {"no_shim_per_s": free, "share_per_s": held, "ratio": round(ratio, 3),
                "per_second": [line.get("kernels") for line in held_lines],
                "shim_messages": [m for m in stderr.splitlines() if "[gpushare]" in m][:5]}),
    ]
    save(records, "spin_share.jsonl")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
