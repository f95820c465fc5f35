"""PyTorch under a 2 GiB limit: allocates until torch.cuda.OutOfMemoryError near 2 GiB, and
torch.cuda.mem_get_info() reports the slice; with the default allocator, expandable_segments:True and
backend:cudaMallocAsync (each in its own process, as PYTORCH_CUDA_ALLOC_CONF is read at CUDA start).

    python scripts/gpu/torch_oom.py            (parent: runs the three children under the shim, judges)
    python scripts/gpu/torch_oom.py --child    (one child: prints JSON lines)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GiB, MiB, report, run_json, save, shim_env  # noqa: E402

LIMIT = 2 * GiB
CHUNK = 64 * MiB
CONFIGS = ["", "expandable_segments:True", "backend:cudaMallocAsync"]


def child() -> int:
    import torch

    free0, total0 = torch.cuda.mem_get_info()
    print(json.dumps({"op": "start", "free": free0, "total": total0}), flush=True)
    held, allocated = [], 0
    try:
        while allocated < 64 * GiB:
            held.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
            allocated += CHUNK
        oom = False
    except torch.cuda.OutOfMemoryError:
        oom = True
    free1, total1 = torch.cuda.mem_get_info()
    print(json.dumps({"op": "oom", "oom": oom, "allocated": allocated, "free": free1, "total": total1,
                      "reserved": torch.cuda.memory_reserved()}), flush=True)
    del held
    torch.cuda.empty_cache()
    free2, total2 = torch.cuda.mem_get_info()
    print(json.dumps({"op": "after_free", "free": free2, "total": total2}), flush=True)
    return 0


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP torch_oom: PyTorch is not installed here", flush=True)
        return 2
    records = []
    work = Path(tempfile.mkdtemp(prefix="gs-torch-"))
    for conf in CONFIGS:
        env = shim_env(work, CUDA_DEVICE_MEMORY_LIMIT=LIMIT)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        lines, stderr = run_json([sys.executable, __file__, "--child"], env)
        by_op = {line.get("op"): line for line in lines}
        start, oom, after = by_op.get("start", {}), by_op.get("oom", {}), by_op.get("after_free", {})
        # Near 2 GiB: the context charge (GPUSHARE_CONTEXT_RESERVE, 256 MiB by default) and one chunk may be short.
        ok = (oom.get("oom") is True and LIMIT - 512 * MiB <= oom.get("allocated", 0) <= LIMIT
              and start.get("total") == LIMIT and oom.get("total") == LIMIT and oom.get("free", -1) < CHUNK
              and after.get("total") == LIMIT)
        records.append(report(f"torch OOM near 2 GiB [{conf or 'default allocator'}]", ok,
                              {"start": start, "oom": oom, "after_free": after,
                               "shim_messages": [m for m in stderr.splitlines() if "[gpushare]" in m][:5]}))
    save(records, "torch_oom.jsonl")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(child() if "--child" in sys.argv else main())
