"""`devplugin demo` (what `make demo` runs) shows the seed node and the seed job, then exits 0."""

from __future__ import annotations

import subprocess
import sys


def test_demo_shows_the_seed_node_and_job() -> None:
    proc = subprocess.run([sys.executable, "-m", "devplugin", "demo"], capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "aliyun.com/gpu-core.percentage: capacity 400, allocatable 400" in out
    assert "aliyun.com/gpu-mem: capacity 60, allocatable 60" in out
    assert "aliyun.com/gpu-count: capacity 4, allocatable 4" in out
    assert "+ cuda-sample" in out and "CUDA_DEVICE_SM_LIMIT=30" in out and "CUDA_DEVICE_MEMORY_LIMIT_0=2048m" in out
    assert "x bad-core" in out and "multiple of 5" in out
    assert out.count("its sockets left behind: none") == 2
    assert "binpack" in out and "spread" in out
    assert "cuMemGetInfo: total 2048 MiB" in out  # the shim is built by `make test` before the tests run
    assert "NVML (what nvidia-smi shows): total 2048 MiB" in out
