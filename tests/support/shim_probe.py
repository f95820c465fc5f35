"""Running the shim's C test programs (shim/tests, built into build/shim/tests) over the fake driver.

Each test gets a fake node (devplugin_sim.fake_driver) and runs `gs_probe` in a subprocess, with the shim
preloaded or not; the probe prints one JSON object per step.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devplugin import contract
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, seed_uuid

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
SHIM = BUILD / "shim" / "test" / "libgpushare.so"  # the test build: honours GPUSHARE_REAL_LIB*
SHIPPED_SHIM = BUILD / "shim" / "libgpushare.so"  # as the image ships it
TESTS = BUILD / "shim" / "tests"
FAKE_CUDA = BUILD / "fakes" / "libcuda.so.1"
FAKE_NVML = BUILD / "fakes" / "libnvidia-ml.so.1"

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_PERMITTED = 800
MiB = 1 << 20
GiB = 1 << 30

# Env the probe must not inherit from whoever runs the tests.
_SCRUB = ("CUDA_", "GPUSHARE_", "GPU_CORE_", "LIBCUDA_", "FAKE_", "LD_PRELOAD", "GS_PROBE_")


def require_built() -> None:
    missing = [p for p in (SHIM, FAKE_CUDA, FAKE_NVML, TESTS / "gs_probe") if not p.exists()]
    if missing:
        pytest.fail(f"not built: {', '.join(map(str, missing))}; run `make native` in the repository root")


def gpus(n: int = 2, memory_mib: int = 16384) -> list[FakeGPU]:
    return [
        FakeGPU(index=i, uuid=seed_uuid(i, "shim"), name="Tesla V100-SXM2-16GB", memory_mib=memory_mib, minor=i,
                pci_bus_id=f"00000000:00:{0x07 + i:02X}.0")
        for i in range(n)
    ]


@dataclass
class Node:
    """A fake node and the files of one container on it."""

    driver: FakeDriver
    dir: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def cache(self) -> Path:
        return self.dir / "usage.cache"

    def uuid(self, i: int) -> str:
        return self.driver.gpus[i].uuid

    def write_limits(self, limits: contract.Limits, name: str = "limits") -> Path:
        path = self.dir / name
        path.write_text(contract.render_limits(limits))
        return path

    def env(self, shim: bool = True, **settings: str | int) -> dict[str, str]:
        """Env of a container process: the fake driver, the shim (unless shim=False) and these settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
        env.update(self.driver.env())
        env.update({
            "GS_PROBE_LIBCUDA": str(FAKE_CUDA),
            "GS_PROBE_LIBNVML": str(FAKE_NVML),
            # The shim's test build takes the fake drivers from these; the shipped library (which a daemon under
            # test may hand out) finds them by soname, as a node's driver.
            contract.ENV_REAL_LIBCUDA: str(FAKE_CUDA),
            contract.ENV_REAL_LIBNVML: str(FAKE_NVML),
            "LD_LIBRARY_PATH": ":".join(p for p in (str(FAKE_CUDA.parent), os.environ.get("LD_LIBRARY_PATH", "")) if p),
            contract.ENV_SHARED_CACHE: str(self.cache),
            contract.ENV_CONTEXT_RESERVE: "0",
        })
        if shim:
            env["LD_PRELOAD"] = str(SHIM)
        env.update(self.extra)
        env.update({k: str(v) for k, v in settings.items()})
        return env


def make_node(tmp_path: Path, n: int = 2, memory_mib: int = 16384) -> Node:
    require_built()
    return Node(FakeDriver.create(tmp_path / "node", gpus(n, memory_mib)), tmp_path)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    """A fake node of two 16 GiB GPUs (the fixture of the shim's tests; a test file may define its own)."""
    return make_node(tmp_path)


def run(env: dict[str, str], *steps: str | int, mode: str = "gpa", timeout: float = 60) -> list[dict]:
    """Run the probe to the end; its JSON lines, parsed. The probe's stderr goes to result.stderr."""
    return run_full(env, *steps, mode=mode, timeout=timeout).steps


@dataclass
class Result:
    steps: list[dict]
    stderr: str
    returncode: int

    def step(self, op: str, nth: int = 0) -> dict:
        return [s for s in self.steps if s["op"] == op][nth]


def run_full(env: dict[str, str], *steps: str | int, mode: str = "gpa", timeout: float = 60) -> Result:
    program = TESTS / ("gs_probe_linked" if mode == "linked" else "gs_probe")
    proc = subprocess.run([str(program), mode, *map(str, steps)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"gs_probe failed ({proc.returncode}): {proc.stderr}")
    return Result([json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr,
                  proc.returncode)


def start(env: dict[str, str], *steps: str | int, mode: str = "gpa") -> subprocess.Popen:
    """Start the probe (use a `ready` step to hold it); read its lines with next_step()."""
    program = TESTS / ("gs_probe_linked" if mode == "linked" else "gs_probe")
    return subprocess.Popen([str(program), mode, *map(str, steps)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def next_step(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"gs_probe ended early: {proc.stderr.read()}")
    return json.loads(line)


def until(proc: subprocess.Popen, op: str) -> list[dict]:
    """Steps up to and including the first `op` step."""
    seen = []
    while not seen or seen[-1]["op"] != op:
        seen.append(next_step(proc))
    return seen


def go_on(*procs: subprocess.Popen) -> None:
    """Let probes held at a `ready` step go on."""
    for proc in procs:
        proc.stdin.write("\n")
        proc.stdin.flush()


def go_on_together(*procs: subprocess.Popen) -> None:
    """Wait until every probe is held at its `ready` step, then let them all go on at once."""
    for proc in procs:
        until(proc, "ready")
    go_on(*procs)
