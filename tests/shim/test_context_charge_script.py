"""scripts/gpu/context_charge.py (how the per-process context charge is calibrated on a GPU), run against the
fake driver, whose contexts take a known amount of memory."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.shim_probe import BUILD, REPO, make_node


def test_the_calibration_script_finds_the_context_size_and_rounds_it_to_the_granularity(tmp_path):
    node = make_node(tmp_path)
    env = node.env(shim=False, FAKE_CUDA_CONTEXT_MIB=301, OUT=tmp_path / "out",
                   LD_LIBRARY_PATH=BUILD / "fakes", GS_PROBE_LIBCUDA="")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "context_charge.py"), "--samples", "2"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    records = [json.loads(line) for line in (tmp_path / "out" / "context_charge.jsonl").read_text().splitlines()]
    assert [r["samples_mib"] for r in records[:2]] == [[301.0, 301.0]] * 2  # lazy and eager module loading
    assert records[2]["setting"] == "GPUSHARE_CONTEXT_RESERVE=302m"  # rounded up to the 2 MiB granularity
