"""What a process sees of the (fake) NVIDIA driver, printed as one JSON line per step; run as a container's process.

    python tests/fakes/driver_probe.py STEP...

Steps:
    pid             this process's pid (1 as the first process of a PID namespace)
    nvml            nvmlInit; the count, each GPU's UUID, index and used/total memory; nvmlShutdown
    nvmlprocs I     the pids NVML lists on GPU I (nvmlDeviceGetComputeRunningProcesses)
    cuda            cuInit; the count and each device's UUID (cuDeviceGetUuid_v2)
    alloc D MIB     a context on CUDA device D and one cuMemAlloc of MIB MiB there (kept)
    forkalloc D MIB fork a child that does `alloc D MIB`, prints {"op": "forkalloc", "pid", "rc"} and lives as long
                    as this process
    ready           print {"op": "ready"} and wait for a line on stdin
An NVML or CUDA failure is reported in the step ("rc") and the probe goes on.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MIB = 1 << 20


def out(op: str, **fields: object) -> None:
    print(json.dumps({"op": op, **fields}), flush=True)


def nvml_step() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        out("nvml", rc=e.value)
        return
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append({"index": pynvml.nvmlDeviceGetIndex(h), "uuid": pynvml.nvmlDeviceGetUUID(h),
                         "used": mem.used, "total": mem.total})
        out("nvml", rc=0, count=len(gpus), gpus=gpus)
    finally:
        pynvml.nvmlShutdown()


def nvml_procs_step(index: int) -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out("nvmlprocs", pids=sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)))
    finally:
        pynvml.nvmlShutdown()


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.kept: list[int] = []
        self.children: list[int] = []  # write ends of the pipes forked children wait on

    def cuda_step(self) -> None:
        rc = self.lib.cuInit(0)
        if rc:
            out("cuda", rc=rc)
            return
        count = ctypes.c_int()
        self.lib.cuDeviceGetCount(ctypes.byref(count))
        uuids = []
        for d in range(count.value):
            raw = (ctypes.c_ubyte * 16)()
            self.lib.cuDeviceGetUuid_v2(raw, d)
            h = bytes(raw).hex()
            uuids.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
        out("cuda", rc=0, count=count.value, uuids=uuids)

    def alloc_step(self, dev: int, mib: int) -> None:
        ctx = ctypes.c_void_p()
        rc = self.lib.cuInit(0) or self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        rc = rc or self.lib.cuCtxSetCurrent(ctx)
        ptr = ctypes.c_uint64()
        rc = rc or self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * MIB))
        if not rc:
            self.kept.append(ptr.value)
        out("alloc", rc=rc)


def fork_alloc(cuda: Cuda, dev: int, mib: int) -> None:
    """A child process that allocates and then waits for this process to end (its pipe closes)."""
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(w)
        ctx = ctypes.c_void_p()
        ptr = ctypes.c_uint64()
        rc = cuda.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) or cuda.lib.cuCtxSetCurrent(ctx)
        rc = rc or cuda.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * MIB))
        out("forkalloc", pid=os.getpid(), rc=rc)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    cuda.children.append(w)


def main(argv: list[str]) -> int:
    cuda: Cuda | None = None
    steps = iter(argv)
    for op in steps:
        if op == "pid":
            out("pid", pid=os.getpid())
        elif op == "nvml":
            nvml_step()
        elif op == "nvmlprocs":
            nvml_procs_step(int(next(steps)))
        elif op in ("cuda", "alloc", "forkalloc"):
            cuda = cuda or Cuda()
            if op == "cuda":
                cuda.cuda_step()
            elif op == "alloc":
                cuda.alloc_step(int(next(steps)), int(next(steps)))
            else:
                fork_alloc(cuda, int(next(steps)), int(next(steps)))
        elif op == "ready":
            out("ready")
            sys.stdin.readline()
        else:
            print(f"driver_probe: unknown step {op!r} (see the module's docstring)", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
