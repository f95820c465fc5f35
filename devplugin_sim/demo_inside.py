"""What a container sees under the isolation shim: a CUDA program (the shim's gs_probe) run on the simulated GPU
with exactly the env and mounts the kubelet gave the container. Used by the demo when the shim is built."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from devplugin import contract
from devplugin_sim.fake_driver import FakeDriver
from devplugin_sim.kubelet import ContainerResult

REPO = Path(__file__).resolve().parents[1]
SHIM_LIB = REPO / "build" / "shim" / "test" / "libgpushare.so"  # the test build: it loads the fake drivers
PROBE = REPO / "build" / "shim" / "tests" / "gs_probe"
FAKE_CUDA = REPO / "build" / "fakes" / "libcuda.so.1"
FAKE_NVML = REPO / "build" / "fakes" / "libnvidia-ml.so.1"
MIB = 1 << 20


def shim_built() -> bool:
    return all(p.exists() for p in (SHIM_LIB, PROBE, FAKE_CUDA, FAKE_NVML))


def inside_view(driver: FakeDriver, container: ContainerResult) -> list[str]:
    """Lines saying what cuMemGetInfo, NVML and a fill-up allocation report inside the container."""
    mounts = {m.container_path: m.host_path for m in container.mounts}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPUSHARE_", "LD_PRELOAD"))}
    env.update(driver.env())
    env.update(container.envs)
    env.update({
        "LD_PRELOAD": mounts[contract.CONTAINER_LIB_PATH],
        contract.ENV_LIMITS_FILE: mounts[contract.CONTAINER_LIMITS_PATH],
        contract.ENV_SHARED_CACHE: mounts[contract.CONTAINER_SHARED_CACHE],
        contract.ENV_REAL_LIBCUDA: str(FAKE_CUDA), contract.ENV_REAL_LIBNVML: str(FAKE_NVML),
        "GS_PROBE_LIBCUDA": str(FAKE_CUDA), "GS_PROBE_LIBNVML": str(FAKE_NVML),
    })
    steps = ["init", "ctx", "0", "meminfo", "nvml", "0", "fill", "alloc", "64m", "meminfo"]
    proc = subprocess.run([str(PROBE), "gpa", *steps], env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return [f"(the CUDA probe failed: {proc.stderr.strip()})"]
    by_op: dict[str, list[dict]] = {}
    for line in proc.stdout.splitlines():
        if line.strip():
            step = json.loads(line)
            by_op.setdefault(step["op"], []).append(step)
    first, nvml, fill = by_op["meminfo"][0], by_op.get("nvml", [{}])[0], by_op["fill"][0]
    lines = [f"cuMemGetInfo: total {first['total'] // MIB} MiB, free {first['free'] // MIB} MiB"]
    if "total" in nvml:
        lines.append(f"NVML (what nvidia-smi shows): total {nvml['total'] // MIB} MiB")
    lines.append(f"64 MiB blocks: {fill['bytes'] // MIB} MiB granted, then error {fill['rc']} "
                 "(CUDA_ERROR_OUT_OF_MEMORY)")
    return lines
