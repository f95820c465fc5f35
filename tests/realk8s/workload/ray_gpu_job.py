"""A Ray job for the KubeRay tests, run by `ray job submit` on a RayCluster's head: GPU tasks (`num_gpus=1`, one per
worker pod of the group) that each report what CuPy sees of the worker's GPU, allocate 256 MiB blocks until CuPy
raises its OutOfMemoryError, read nvidia-smi's view while holding them, then (with --spin SECONDS) launch kernels
back to back while still holding that memory, so that the node's fake GPU can time each worker's share of the GPU.
The job prints the Ray cluster's GPU count once the tasks ran (`CLUSTER {json}`), then each task's report
(`RESULT {json}`).

Kernels: an empty kernel from PTX (cupy.RawModule loads it with cuModuleLoad; no compiler needed), launched with
--blocks blocks; on the fake GPU each launch takes blocks x FAKE_CUDA_NS_PER_BLOCK of the GPU's timeline."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import ray

PTX = """.version 8.0
.target sm_80
.address_size 64
.visible .entry spin()
{
    ret;
}
"""
CHUNK_MIB = 256


@ray.remote(num_gpus=1)
def gpu_task(spin_s: float, blocks: int) -> dict:
    import cupy as cp

    cp.cuda.Device(0).use()
    free, total = cp.cuda.runtime.memGetInfo()
    held, error = [], None
    try:
        while True:
            held.append(cp.empty(CHUNK_MIB << 20, dtype=cp.uint8))
    except cp.cuda.memory.OutOfMemoryError as e:
        error = {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.total,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    report = {"pod": os.environ.get("RAY_CLOUD_INSTANCE_ID", ""), "host": os.uname().nodename,
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "free": free, "total": total,
              "held": len(held) * (CHUNK_MIB << 20), "error": error,
              "smi": [[f.strip() for f in line.split(",")] for line in smi.stdout.splitlines() if line.strip()]}
    if spin_s > 0:
        path = f"/tmp/spin-{os.getpid()}.ptx"
        with open(path, "w") as f:
            f.write(PTX)
        kernel = cp.RawModule(path=path).get_function("spin")
        launches, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < spin_s:
            kernel((blocks,), (32,), ())
            launches += 1
        cp.cuda.Device(0).synchronize()
        report.update(launches=launches, blocks=blocks, seconds=time.perf_counter() - t0)
    held.clear()
    cp.get_default_memory_pool().free_all_blocks()  # the worker process stays: leave its GPU memory as found
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1, help="GPU tasks at once (one per worker pod)")
    ap.add_argument("--spin", type=float, default=0.0, help="seconds of kernel launches after the fill")
    ap.add_argument("--blocks", type=int, default=1000, help="blocks per launch")
    ap.add_argument("--gpus", type=float, default=0.0,
                    help="wait until the Ray cluster counts this many GPUs before starting the tasks (a worker pod "
                         "is Running a moment before its raylet joins the cluster)")
    args = ap.parse_args()
    ray.init()
    deadline = time.monotonic() + 180
    while ray.cluster_resources().get("GPU", 0) < args.gpus:
        if time.monotonic() > deadline:
            raise SystemExit(f"the Ray cluster counts {ray.cluster_resources().get('GPU', 0)} GPUs, not {args.gpus}")
        time.sleep(0.5)
    reports = ray.get([gpu_task.remote(args.spin, args.blocks) for _ in range(args.tasks)])
    # counted once the tasks ran, so that every worker that ran one has joined
    print("CLUSTER " + json.dumps({"GPU": ray.cluster_resources().get("GPU", 0)}), flush=True)
    for report in reports:
        print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
