"""PyTorch steps for the shim's tests (tests/cuda/test_torch.py, `make test-torch`), run as a container's process over
the fake driver with the allocator PYTORCH_CUDA_ALLOC_CONF selects: each argument is a step, each step prints one
JSON line. Steps: init | meminfo | fill MiB | freeall | roundtrip | nvml | churn N | ready."""

from __future__ import annotations

import json
import sys
import time

import torch

held: list = []


def out(op: str, **fields: object) -> None:
    print(json.dumps({"op": op, **fields}), flush=True)


def main(steps: list[str]) -> None:
    it = iter(steps)
    for op in it:
        if op == "init":
            ok = torch.cuda.is_available()
            out(op, available=ok, name=torch.cuda.get_device_name(0) if ok else "",
                backend=torch.cuda.get_allocator_backend() if ok else "")
        elif op == "meminfo":
            free, total = torch.cuda.mem_get_info()
            out(op, free=free, total=total)
        elif op == "fill":
            mib = int(next(it))
            n, error, message = 0, "", ""
            try:
                while True:
                    held.append(torch.empty(mib << 20, dtype=torch.uint8, device="cuda"))
                    n += 1
            except torch.OutOfMemoryError as e:
                error, message = type(e).__name__, str(e)
            out(op, count=n, error=error, message=message)
        elif op == "freeall":
            held.clear()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            out(op, reserved=torch.cuda.memory_reserved())
        elif op == "roundtrip":
            x = torch.arange(4096, dtype=torch.float32)
            out(op, same=bool(torch.equal(x.cuda().cpu(), x)))
        elif op == "nvml":
            out(op, used=torch.cuda.device_memory_used(0))
        elif op == "churn":
            # the caching allocator's everyday work: tensors of mixed sizes allocated and freed
            n = int(next(it))
            sizes = [(1 << (10 + i % 14)) + 256 * (i % 7) for i in range(n)]
            keep: list = []
            t0 = time.perf_counter()
            for i, size in enumerate(sizes):
                keep.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
                if len(keep) > 32:
                    keep.pop(i % 32)
            keep.clear()
            torch.cuda.synchronize()
            out(op, seconds=time.perf_counter() - t0, count=n)
        elif op == "ready":
            out(op)
            sys.stdin.readline()
        else:
            raise SystemExit(f"torch_probe: unknown step {op}")


if __name__ == "__main__":
    main(sys.argv[1:])
