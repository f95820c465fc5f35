"""A matmul loop at a 30 % compute share runs at 25-35 % of its unthrottled speed.

    python scripts/gpu/torch_matmul_share.py            (parent: unthrottled and 30 % runs, judges)
    python scripts/gpu/torch_matmul_share.py --child S  (one child: matmuls for S seconds, JSON per second)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import report, run_json, save, shim_env  # noqa: E402

SECONDS = 12
SETTLE = 4  # seconds the controller gets before measuring
SHARE = 30


def child(seconds: float) -> int:
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    start = time.monotonic()
    tick, done = start + 1, 0
    while time.monotonic() < start + seconds:
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
        done += 8
        if time.monotonic() >= tick:
            print(json.dumps({"op": "second", "matmuls": done}), flush=True)
            tick += 1
            done = 0
    return 0


def rate(lines: list[dict]) -> float:
    per_second = [line["matmuls"] for line in lines if line.get("op") == "second"][SETTLE:]
    return sum(per_second) / len(per_second) if per_second else 0.0


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP torch_matmul_share: PyTorch is not installed here", flush=True)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gs-matmul-"))
    argv = [sys.executable, __file__, "--child", str(SECONDS)]
    free_lines, _ = run_json(argv, shim_env(work, shim=False))
    shim_free_lines, _ = run_json(argv, shim_env(work, CUDA_DEVICE_SM_LIMIT=100))
    held_lines, stderr = run_json(argv, shim_env(work, CUDA_DEVICE_SM_LIMIT=SHARE,
                                                 GPU_CORE_UTILIZATION_POLICY="force"))
    full, full_shim, held = rate(free_lines), rate(shim_free_lines), rate(held_lines)
    ratio = held / full if full else 0.0
    records = [
        report("matmul at 100 % under the shim runs at full speed", full_shim >= 0.95 * full,
               {"no_shim_per_s": full, "shim_100_per_s": full_shim}),
        report(f"matmul at {SHARE} % runs at 25-35 % of full speed", 0.25 <= ratio <= 0.35,
               {"no_shim_per_s": full, "share_per_s": held, "ratio": round(ratio, 3),
                "per_second": [line.get("matmuls") for line in held_lines],
                "shim_messages": [m for m in stderr.splitlines() if "[gpushare]" in m][:5]}),
    ]
    save(records, "torch_matmul_share.jsonl")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    if "--child" in sys.argv:
        raise SystemExit(child(float(sys.argv[sys.argv.index("--child") + 1])))
    raise SystemExit(main())
