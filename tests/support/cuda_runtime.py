"""Real CUDA software over the fake driver: NVIDIA's runtime (nvcc-built programs, static and shared cudart) and
CuPy, run as a container's processes on a fake node, with the shim preloaded or not.

The toolkit comes from NVIDIA's wheels (nvidia-cuda-nvcc, -crt, nvvm, -runtime, -nvrtc; the `test` extra of
pyproject.toml pins them): no GPU and no system CUDA are needed. `runtime_probe()` builds tests/cuda/rt_probe.cu
once per cudart kind into build/cuda; the probe prints one JSON object per step (see its header).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from devplugin_sim import cuda_toolkit
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, seed_uuid
from tests.support.shim_probe import BUILD, REPO, Node, require_built

PROBE_SOURCE = REPO / "tests" / "cuda" / "rt_probe.cu"
OUT = BUILD / "cuda"
MiB = 1 << 20
GiB = 1 << 30


def runtime_probe(cudart: str) -> Path:
    """The probe built against `static` or `shared` cudart (rebuilt when its source is newer)."""
    try:
        return cuda_toolkit.build(PROBE_SOURCE, OUT / f"rt_probe_{cudart}", cudart)
    except cuda_toolkit.ToolkitError as e:
        pytest.fail(str(e))


@dataclass
class Run:
    steps: list[dict]
    stderr: str

    def step(self, op: str, nth: int = 0) -> dict:
        return [s for s in self.steps if s["op"] == op][nth]


def run(program: Path, env: dict[str, str], *steps: str | int, timeout: float = 120) -> Run:
    proc = subprocess.run([str(program), *map(str, steps)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{program.name} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return Run([json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")], proc.stderr)


def start(program: Path, env: dict[str, str], *steps: str | int) -> subprocess.Popen:
    return subprocess.Popen([str(program), *map(str, steps)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def until(proc: subprocess.Popen, op: str) -> list[dict]:
    seen: list[dict] = []
    while not seen or seen[-1]["op"] != op:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise AssertionError(f"probe ended early: {proc.stderr.read() if proc.stderr else ''}")
        seen.append(json.loads(line))
    return seen


A100_PCI_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)  # where an 8-GPU A100 server has its GPUs


def a100_node(tmp_path: Path, gpus: int = 1) -> Node:
    """A fake node of `gpus` A100s (40 GiB, 108 SMs, compute capability 8.0: CUDA 13 compiles for nothing older;
    each at its own PCI location); its processes' device memory holds real bytes (copies round-trip)."""
    require_built()
    if not 1 <= gpus <= len(A100_PCI_BUSES):
        raise ValueError(f"an A100 node has 1 to {len(A100_PCI_BUSES)} GPUs, not {gpus}")
    node = Node(FakeDriver.create(tmp_path / "node", [
        FakeGPU(index=i, uuid=seed_uuid(i, "a100"), name="NVIDIA A100-SXM4-40GB", memory_mib=40960, minor=i,
                pci_bus_id=f"00000000:{bus:02X}:00.0", sms=108, compute_capability=(8, 0))
        for i, bus in enumerate(A100_PCI_BUSES[:gpus])
    ]), tmp_path)
    node.extra["FAKE_CUDA_HOST_BACKED"] = "1"
    return node
