"""CuPy steps for the shim's tests (tests/cuda/test_cupy.py), run as a container's process over the fake driver: each
argument is a step, each step prints one JSON line. Steps: init | meminfo | fill MiB | freeall | nvml |
kernel | asyncfill MiB | gemm N | gemmfor SECONDS N | ready."""

from __future__ import annotations

import json
import sys
import time

import cupy as cp

held: list = []


def out(op: str, **fields: object) -> None:
    print(json.dumps({"op": op, **fields}), flush=True)


def fill(mib: int) -> None:
    n = 0
    try:
        while True:
            held.append(cp.empty(mib << 20, dtype=cp.uint8))
            n += 1
    except cp.cuda.memory.OutOfMemoryError as e:
        out("fill", count=n, error=type(e).__name__, message=str(e))


def gemm(n: int) -> None:
    """An N x N float32 matmul through cuBLAS (cublasGemmEx, which runs on cuBLASLt), its operand and result held
    until `freeall`. The fake driver runs no kernels, so the result's values mean nothing and are not reported."""
    t0 = time.perf_counter()
    try:
        a = cp.ones((n, n), dtype=cp.float32)
        c = a @ a
        cp.cuda.Device(0).synchronize()
    except Exception as e:  # cuBLAS, CUDA runtime or CuPy: the step reports what the user would see
        out("gemm", ok=False, n=n, seconds=time.perf_counter() - t0, error=type(e).__name__, message=str(e))
        return
    held.extend((a, c))
    out("gemm", ok=True, n=n, shape=list(c.shape), seconds=time.perf_counter() - t0)


def gemm_for(seconds: float, n: int) -> None:
    """N x N float32 matmuls queued back to back for about `seconds`, then waited for."""
    a = cp.ones((n, n), dtype=cp.float32)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a
        count += 1
    cp.cuda.Device(0).synchronize()
    out("gemmfor", count=count, seconds=time.perf_counter() - t0)


def main(steps: list[str]) -> None:
    it = iter(steps)
    for op in it:
        if op == "init":
            cp.cuda.Device(0).use()
            out(op, runtime=cp.cuda.runtime.runtimeGetVersion(), driver=cp.cuda.runtime.driverGetVersion())
        elif op == "meminfo":
            free, total = cp.cuda.runtime.memGetInfo()
            out(op, free=free, total=total)
        elif op == "fill":
            fill(int(next(it)))
        elif op == "freeall":
            held.clear()
            cp.get_default_memory_pool().free_all_blocks()
            out(op)
        elif op == "nvml":
            import pynvml

            pynvml.nvmlInit()
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
            out(op, total=info.total, free=info.free, used=info.used)
        elif op == "kernel":
            # compiled by NVRTC, loaded with cuModuleLoadData, launched (the fake times kernels, runs none)
            double = cp.ElementwiseKernel("float32 x", "float32 y", "y = 2 * x", "double_it")
            x = cp.arange(1024, dtype=cp.float32)
            y = double(x)
            cp.cuda.Device(0).synchronize()
            back = cp.asnumpy(x)  # a copy back from the device: the host-backed fake keeps the bytes
            out(op, shape=list(y.shape), copied=bool(back.sum() == 0 or back[5] == 5.0))
        elif op == "asyncfill":
            # CuPy's stream-ordered pool (cudaMallocAsync), whose limit CuPy keeps in the release threshold
            cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
            fill(int(next(it)))
        elif op == "gemm":
            gemm(int(next(it)))
        elif op == "gemmfor":
            gemm_for(float(next(it)), int(next(it)))
        elif op == "ready":
            out(op)
            sys.stdin.readline()
        else:
            raise SystemExit(f"cupy_probe: unknown step {op}")


if __name__ == "__main__":
    main(sys.argv[1:])
