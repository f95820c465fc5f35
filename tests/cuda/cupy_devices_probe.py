"""CuPy on every GPU a container sees, for the shim's tests (tests/cuda/test_multi_gpu_share.py), run as a container's
process over the fake driver: each argument is a step, each step prints one JSON line. Steps:
devices (the count, and each device's memory as CuPy sees it) | alloc DEVICE MiB | fill DEVICE MiB | ready."""

from __future__ import annotations

import json
import sys

import cupy as cp

held: list = []


def out(op: str, **fields: object) -> None:
    print(json.dumps({"op": op, **fields}), flush=True)


def devices() -> None:
    seen = []
    for i in range(cp.cuda.runtime.getDeviceCount()):
        with cp.cuda.Device(i):
            free, total = cp.cuda.runtime.memGetInfo()
        props = cp.cuda.runtime.getDeviceProperties(i)
        seen.append({"free": free, "total": total, "total_global": props["totalGlobalMem"],
                     "pci_bus": props["pciBusID"]})
    out("devices", count=len(seen), devices=seen)


def alloc(device: int, mib: int) -> None:
    with cp.cuda.Device(device):
        a = cp.empty(mib << 20, dtype=cp.uint8)
    held.append(a)
    out("alloc", device=a.device.id)


def fill(device: int, mib: int) -> None:
    n = 0
    with cp.cuda.Device(device):
        try:
            while True:
                held.append(cp.empty(mib << 20, dtype=cp.uint8))
                n += 1
        except cp.cuda.memory.OutOfMemoryError as e:
            out("fill", device=device, count=n, error=type(e).__name__)


def main(steps: list[str]) -> None:
    it = iter(steps)
    for op in it:
        if op == "devices":
            devices()
        elif op == "alloc":
            alloc(int(next(it)), int(next(it)))
        elif op == "fill":
            fill(int(next(it)), int(next(it)))
        elif op == "ready":
            out(op)
            sys.stdin.readline()
        else:
            raise SystemExit(f"cupy_devices_probe: unknown step {op}")


if __name__ == "__main__":
    main(sys.argv[1:])
