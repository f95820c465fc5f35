"""PyTorch 2.14.1 (its CUDA 13.0 build) over the fake driver, with the shim, at a 2 GiB slice of a 40 GiB GPU,
under each of its allocators: what a PyTorch user relies on (tests/cuda/torch_probe.py does the PyTorch side).

PyTorch lives in its own venv (.venv-torch, requirements-torch.txt: 3 GB); `make test-torch` makes it and runs
these tests (`-m torch`). The plain suite deselects them (pyproject addopts)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cuda_runtime import REPO, GiB, MiB, a100_node

pytestmark = pytest.mark.torch

PROBE = REPO / "tests" / "cuda" / "torch_probe.py"
TORCH_PYTHON = Path(os.environ.get("GPUSHARE_TORCH_PYTHON", REPO / ".venv-torch" / "bin" / "python"))
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "2g"}
ALLOCATORS = {
    "caching": "",
    "expandable-segments": "expandable_segments:True",
    "cudaMallocAsync": "backend:cudaMallocAsync",
}


@pytest.fixture
def node(tmp_path):
    if not TORCH_PYTHON.exists():
        pytest.fail(f"no PyTorch venv at {TORCH_PYTHON}: run `make test-torch`")
    return a100_node(tmp_path)


def torch_run(env: dict[str, str], *steps: str | int) -> dict[str, list[dict]]:
    proc = subprocess.run([str(TORCH_PYTHON), str(PROBE), *map(str, steps)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_op: dict[str, list[dict]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            step = json.loads(line)
            by_op.setdefault(step["op"], []).append(step)
    return by_op


@pytest.mark.parametrize("allocator", list(ALLOCATORS))
def test_pytorch_sees_the_slice_and_stops_at_it_with_its_own_error(node, allocator):
    env = node.env(**LIMIT, PYTORCH_CUDA_ALLOC_CONF=ALLOCATORS[allocator])
    r = torch_run(env, "init", "meminfo", "fill", 256, "freeall", "meminfo", "nvml", "roundtrip")
    assert r["init"][0]["available"]
    assert (r["meminfo"][0]["free"], r["meminfo"][0]["total"]) == (2 * GiB, 2 * GiB)
    fill = r["fill"][0]
    assert fill["error"] == "OutOfMemoryError"
    if allocator == "cudaMallocAsync":
        assert re.search(r"Device limit\s*:\s*2\.00 GiB", fill["message"]), fill["message"]
    else:
        assert "total capacity of 2.00 GiB" in fill["message"], fill["message"]
    # 8 x 256 MiB fit; expandable segments map 20 MiB pages and round up, so the 8th does not
    assert fill["count"] == (7 if allocator == "expandable-segments" else 8)
    assert r["meminfo"][1]["free"] == 2 * GiB  # empty_cache gives it all back
    assert r["nvml"][0]["used"] == 0  # NVML agrees
    assert r["roundtrip"][0]["same"]  # tensor.cuda().cpu() comes back


def test_a_second_process_of_the_container_sees_the_first_ones_use(node):
    env = node.env(**LIMIT)
    first = subprocess.Popen([str(TORCH_PYTHON), str(PROBE), "init", "fill", "512", "ready"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        steps = []
        while not steps or steps[-1]["op"] != "ready":
            line = first.stdout.readline() if first.stdout else ""
            assert line, first.stderr.read() if first.stderr else ""
            if line.startswith("{"):
                steps.append(json.loads(line))
        assert steps[1]["count"] == 4
        r = torch_run(env, "init", "meminfo", "fill", 256)
        assert r["meminfo"][0]["free"] < 16 * MiB and r["fill"][0]["count"] == 0
    finally:
        first.communicate("\n", timeout=120)
