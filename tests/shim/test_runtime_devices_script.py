"""scripts/gpu/runtime_devices.py (the real-GPU proof that NVIDIA's runtime starts under the shim on a share of
two GPUs, each at its own limit) run against the fake driver: a dry run of the script, not a proof."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cuda_runtime import a100_node
from tests.support.shim_probe import BUILD, REPO

SCRIPT = REPO / "scripts" / "gpu" / "runtime_devices.py"


@pytest.mark.parametrize("gpus", [2, 1])
def test_the_runtime_devices_check_passes_over_the_fake_driver(tmp_path, gpus):
    node = a100_node(tmp_path, gpus=gpus)
    env = node.env(shim=False, OUT=tmp_path / "out", LD_LIBRARY_PATH=BUILD / "fakes")
    out = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    if gpus == 1:
        assert out.stdout.startswith("SKIP runtime_devices"), out.stdout
        return
    records = [json.loads(line) for line in (tmp_path / "out" / "runtime_devices.jsonl").read_text().splitlines()]
    assert [r["ok"] for r in records] == [True, True], out.stdout
