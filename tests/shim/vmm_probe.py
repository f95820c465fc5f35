"""Running shim/tests/gs_vmm (VMM handles and mappings, shared allocations, pools that keep memory, context limits)
over the fake driver; the same nodes, env and result shape as tests/support/shim_probe.py."""

from __future__ import annotations

import json
import subprocess

from tests.support.shim_probe import TESTS, Result, until

VMM = TESTS / "gs_vmm"
CUDA_ERROR_INVALID_VALUE = 1
KEEP_ALL = str(2**64 - 1)  # a release threshold of "keep everything"


def run(env: dict[str, str], *steps: str | int, mode: str = "gpa", timeout: float = 60) -> Result:
    """Run gs_vmm to the end; its JSON lines, parsed."""
    proc = subprocess.run([str(VMM), mode, *map(str, steps)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"gs_vmm failed ({proc.returncode}): {proc.stderr}")
    return Result([json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr,
                  proc.returncode)


def start(env: dict[str, str], *steps: str | int, mode: str = "gpa") -> subprocess.Popen:
    """Start gs_vmm (a `ready` step holds it); read its lines with shim_probe.until()."""
    return subprocess.Popen([str(VMM), mode, *map(str, steps)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def held(env: dict[str, str], *steps: str | int, mode: str = "gpa") -> tuple[subprocess.Popen, list[dict]]:
    """Start gs_vmm with `steps` and a final `ready`: the process and its steps, while it still holds what it made."""
    proc = start(env, *steps, "ready", mode=mode)
    return proc, until(proc, "ready")


def finish(proc: subprocess.Popen) -> None:
    """Let a held gs_vmm end."""
    if proc.stdin:
        proc.stdin.close()
    proc.wait(timeout=10)
