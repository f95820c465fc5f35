"""Shared helpers of the real-GPU proof scripts: where the shim is, and the env of a process under it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "build" / "shim" / "libgpushare.so"
PROBE = REPO / "build" / "shim" / "tests" / "gs_probe"
MiB = 1 << 20
GiB = 1 << 30


def out_dir() -> Path:
    """Where results go: $OUT (the device runner's folder) or /tmp/gpushare-gpu."""
    path = Path(os.environ.get("OUT") or "/tmp/gpushare-gpu")
    path.mkdir(parents=True, exist_ok=True)
    return path


def shim_env(work: Path, shim: bool = True, **settings: str | int) -> dict[str, str]:
    """Env of a process under the shim (the real driver, found by soname), with its own accounting file."""
    if shim and not SHIM.exists():
        raise SystemExit(f"{SHIM} is missing: run `make native` first")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_DEVICE_", "GPUSHARE_", "GPU_CORE_", "LD_PRELOAD"))}
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(work / "usage.cache")
    if shim:
        env["LD_PRELOAD"] = str(SHIM)
    env.update({k: str(v) for k, v in settings.items()})
    return env


def run_json(argv: list[str], env: dict[str, str], timeout: float = 600) -> tuple[list[dict], str]:
    """Run a command that prints JSON lines; its parsed lines and its stderr."""
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    lines = []
    for line in proc.stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if proc.returncode:
        lines.append({"error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]})
    return lines, proc.stderr


def report(name: str, ok: bool, details: dict) -> dict:
    """Print one verdict line and return it as a record."""
    record = {"check": name, "ok": ok, **details}
    print(("PASS " if ok else "FAIL ") + name + " " + json.dumps(details), flush=True)
    return record


def save(records: list[dict], name: str) -> None:
    path = out_dir() / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    print(f"results: {path}", file=sys.stderr)
