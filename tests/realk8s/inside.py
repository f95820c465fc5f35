"""What a workload saw inside its container (the workload probe's JSON, tests/realk8s/workload/probe.py), and the
checks of it against what the pod asked for. Each check returns the mismatches it found, one sentence each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GiB = 1 << 30


@dataclass(frozen=True)
class View:
    """One container's view of its GPUs."""

    raw: dict[str, Any]

    @property
    def nvml_uuids(self) -> list[str]:
        return [g["uuid"] for g in self.raw["nvml"].get("gpus", [])]

    @property
    def nvml_totals(self) -> list[int]:
        return [int(g["total"]) for g in self.raw["nvml"].get("gpus", [])]

    @property
    def smi_uuids(self) -> list[str]:
        return [row[1] for row in self.raw["smi"]["rows"] if len(row) > 1]

    @property
    def smi_totals_mib(self) -> list[int]:
        return [int(row[2]) for row in self.raw["smi"]["rows"] if len(row) > 2]

    def runtime_step(self, op: str) -> dict[str, Any] | None:
        rt = self.raw["runtime"]
        for s in rt.get("steps", []):
            if s["op"] == op:
                return dict(s)
        return None

    @property
    def runtime_total(self) -> int | None:
        step = self.runtime_step("meminfo")
        return int(step["total"]) if step and step.get("rc") == 0 else None

    @property
    def driver(self) -> bool:
        return bool(self.raw["runtime"].get("driver"))

    @property
    def shim_loaded(self) -> bool:
        return bool(self.raw["shim_loaded"])

    @property
    def limits(self) -> dict[str, str]:
        text = self.raw.get("limits") or ""
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.raw["env"])


def sees_no_gpu(v: View) -> list[str]:
    """A container granted no GPU: no driver, no device node, nothing in NVML, the runtime or nvidia-smi."""
    bad = []
    if v.driver:
        bad.append("the NVIDIA driver (libcuda.so.1) is in the container")
    if v.raw["devices"]:
        bad.append(f"device nodes {v.raw['devices']} are in the container")
    if v.nvml_uuids:
        bad.append(f"NVML shows GPUs {v.nvml_uuids}")
    if v.smi_uuids:
        bad.append(f"nvidia-smi shows GPUs {v.smi_uuids}")
    return bad


def sees_slice(v: View, uuids: list[str], memory: int, sm_limit: int | None = None) -> list[str]:
    """A container granted `memory` bytes on each of `uuids` (and `sm_limit` percent of their compute): exactly those
    GPUs in NVML and nvidia-smi, each `memory` bytes in NVML, nvidia-smi and the CUDA runtime, the shim loaded with
    those limits."""
    bad = []
    if sorted(v.nvml_uuids) != sorted(uuids):
        bad.append(f"NVML shows GPUs {v.nvml_uuids}, granted {uuids}")
    if sorted(v.smi_uuids) != sorted(uuids):
        bad.append(f"nvidia-smi shows GPUs {v.smi_uuids}, granted {uuids}")
    if any(t != memory for t in v.nvml_totals):
        bad.append(f"NVML says {v.nvml_totals} bytes of memory, granted {memory}")
    if any(t != memory >> 20 for t in v.smi_totals_mib):
        bad.append(f"nvidia-smi says {v.smi_totals_mib} MiB, granted {memory >> 20}")
    if v.runtime_total != memory:
        bad.append(f"the CUDA runtime (cudaMemGetInfo) says {v.runtime_total} bytes, granted {memory}: "
                   f"{v.raw['runtime']}")
    if not v.shim_loaded:
        bad.append(f"the shim is not preloaded (/etc/ld.so.preload: {v.raw['preload']})")
    lim = v.limits
    for uuid in sorted(uuids):
        keys = [k for k, val in lim.items() if k.endswith(".uuid") and val == uuid]
        if not keys:
            bad.append(f"the limits file does not name {uuid}: {lim}")
            continue
        dev = keys[0].rsplit(".", 1)[0]
        if int(lim.get(f"{dev}.memory_limit", -1)) != memory:
            bad.append(f"the limits file caps {uuid} at {lim.get(f'{dev}.memory_limit')}, granted {memory}")
        if sm_limit is not None and int(lim.get(f"{dev}.sm_limit", -1)) != sm_limit:
            bad.append(f"the limits file gives {uuid} sm_limit {lim.get(f'{dev}.sm_limit')}, granted {sm_limit}")
    return bad
