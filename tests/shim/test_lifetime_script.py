"""scripts/gpu/lifetime_checks.py (the real-GPU proof that memory outliving its allocation call stays charged), run
against the fake driver, which keeps such memory as the driver documents: a dry run of the script, not a proof."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.shim_probe import BUILD, REPO, make_node


def test_the_lifetime_checks_pass_over_the_fake_driver(tmp_path):
    node = make_node(tmp_path, n=1)
    env = node.env(shim=False, OUT=tmp_path / "out", LD_LIBRARY_PATH=BUILD / "fakes", GS_PROBE_LIBCUDA="")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "lifetime_checks.py")], env=env,
                         capture_output=True, text=True, timeout=180)
    records = [json.loads(line) for line in (tmp_path / "out" / "lifetime_checks.jsonl").read_text().splitlines()]
    assert out.returncode == 0, out.stdout + out.stderr
    assert [r["ok"] for r in records] == [True] * 4
    stack = records[2]
    assert stack["shim_charge_mib"] == stack["driver_took_mib"] == (2048 - 1024) * 80 * 2048 / (1 << 20)
