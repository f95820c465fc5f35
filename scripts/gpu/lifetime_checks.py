"""Memory that outlives its allocation call, on the real driver, under a 2 GiB limit (the shim's default 256 MiB
context charge leaves 1792 MiB): gs_vmm (shim/tests) reaches libcuda.so.1 through cuGetProcAddress_v2. Each check
also reads the GPU's used memory from NVML, so the driver's side of the rule is seen, not assumed:

- VMM pages whose handle is released right after mapping (NVIDIA's VMM sample) stay charged, and the GPU holds them,
  until unmapped;
- a stream-ordered pool that keeps everything holds its freed memory (the GPU still shows it), so a second such pool
  finds no room until the first is trimmed;
- a larger stack (cuCtxSetLimit) is charged for every thread the GPU holds at once; the check prints what the
  driver took (NVML) beside the shim's charge, and fails if the shim charged less;
- memory imported from another process's shareable descriptor is charged to the importer, and stays charged (and
  on the GPU) after the exporter is gone.

    python scripts/gpu/lifetime_checks.py [--gpu 0]

Run it on an idle GPU (others' allocations meanwhile move the NVML figures). Results in $OUT/lifetime_checks.jsonl.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, GiB, MiB, report, save, shim_env  # noqa: E402

VMM = REPO / "build" / "shim" / "tests" / "gs_vmm"
LIMIT = 2 * GiB
ROOM = LIMIT - 256 * MiB  # after the default context charge
KEEP_ALL = str(2**64 - 1)
OOM = 2


def gpu_used(gpu: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).used)
    finally:
        pynvml.nvmlShutdown()


class Held:
    """gs_vmm run step by step: each `ready` holds it, so that NVML can be read while it holds its memory."""

    def __init__(self, env: dict[str, str], gpu: int, *steps: str | int) -> None:
        import json

        self._json = json
        self.proc = subprocess.Popen([str(VMM), "gpa", *map(str, steps)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.gpu = gpu
        self.steps: list[dict] = []

    def until_ready(self) -> list[dict]:
        seen: list[dict] = []
        while not seen or seen[-1].get("op") != "ready":
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            if not line:
                seen.append({"op": "ended", "stderr": self.proc.stderr.read()[-1000:] if self.proc.stderr else ""})
                break
            seen.append(self._json.loads(line))
        self.steps += seen
        time.sleep(0.5)  # NVML's memory figure follows the driver's
        return seen

    def go_on(self) -> None:
        if self.proc.stdin and self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()

    def end(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def rcs(steps: list[dict], op: str) -> list[int]:
    return [s["rc"] for s in steps if s.get("op") == op]


def vmm_sample(work: Path, gpu: int) -> dict:
    pages = ROOM // (256 * MiB)  # 7
    steps: list[str | int] = ["init", "ctx", gpu]
    for i in range(pages):
        steps += ["create", "256m", "map", i, "release", i]
    steps += ["create", "256m", "meminfo", "ready"]
    steps += [x for i in range(pages) for x in ("unmap", i)] + ["meminfo", "ready", "create", "1g", "ready"]
    before = gpu_used(gpu)
    run = Held(shim_env(work, CUDA_DEVICE_MEMORY_LIMIT=LIMIT), gpu, *steps)
    try:
        first = run.until_ready()
        mapped = gpu_used(gpu) - before
        run.go_on()
        second = run.until_ready()
        unmapped = gpu_used(gpu) - before
        run.go_on()
        third = run.until_ready()
    finally:
        run.end()
    creates = rcs(first, "create")
    ok = (creates == [0] * pages + [OOM] and mapped >= pages * 256 * MiB
          and unmapped < mapped - (pages * 256 - 64) * MiB and rcs(third, "create") == [0]
          and [s["used"] for s in first + second if s.get("op") == "meminfo"] == [LIMIT, 256 * MiB])
    return report("VMM pages released while mapped stay charged and held until unmapped", ok,
                  {"creates": creates, "gpu_mib_mapped": mapped // MiB, "gpu_mib_unmapped": unmapped // MiB,
                   "steps": run.steps[-12:]})


def pools(work: Path, gpu: int) -> dict:
    before = gpu_used(gpu)
    run = Held(shim_env(work, CUDA_DEVICE_MEMORY_LIMIT=LIMIT), gpu, "init", "ctx", gpu, "pool", KEEP_ALL,
               "palloc", 0, "1g", "afree", 0, "sync", "meminfo", "ready", "pool", KEEP_ALL, "palloc", 1, "1g",
               "trim", 0, "0", "palloc", 1, "1g", "ready")
    try:
        first = run.until_ready()
        kept = gpu_used(gpu) - before
        run.go_on()
        second = run.until_ready()
    finally:
        run.end()
    ok = (rcs(first, "palloc") == [0] and kept >= GiB and rcs(second, "palloc") == [OOM, 0]
          and [s["used"] for s in first if s.get("op") == "meminfo"] == [256 * MiB + GiB])
    return report("a pool that keeps its freed memory holds it, and a second such pool finds no room", ok,
                  {"gpu_mib_kept_after_free": kept // MiB, "steps": run.steps})


def stack(work: Path, gpu: int) -> dict:
    run = Held(shim_env(work, CUDA_DEVICE_MEMORY_LIMIT=LIMIT), gpu, "init", "ctx", gpu, "getlimit", 0, "meminfo",
               "ready", "setlimit", 0, "2k", "meminfo", "ready")
    try:
        first = run.until_ready()
        before = gpu_used(gpu)
        run.go_on()
        second = run.until_ready()
        after = gpu_used(gpu)
    finally:
        run.end()
    infos = [s["used"] for s in first + second if s.get("op") == "meminfo"]
    charged = infos[1] - infos[0] if len(infos) == 2 else 0
    ok = rcs(second, "setlimit") == [0] and charged > 0 and charged >= after - before
    return report("a larger stack is charged at least what the driver takes", ok,
                  {"default_stack": [s.get("value") for s in first if s.get("op") == "getlimit"],
                   "shim_charge_mib": charged / MiB, "driver_took_mib": (after - before) / MiB, "steps": run.steps})


def imported(work: Path, gpu: int) -> dict:
    before = gpu_used(gpu)
    outside = Held(shim_env(work, shim=False), gpu, "init", "ctx", gpu, "create", "1g", "map", 0, "export", 0,
                   "ready")
    steps = outside.until_ready()
    export = next((s for s in steps if s.get("op") == "export"), {"rc": -1})
    if export["rc"] != 0:
        outside.end()
        return report("memory imported from another process is charged to the importer", False, {"steps": steps})
    inside = Held(shim_env(work, CUDA_DEVICE_MEMORY_LIMIT=LIMIT), gpu, "init", "ctx", gpu,
                  "import", export["pid"], export["fd"], "1g", "map", 0, "meminfo", "create", "1g", "ready",
                  "meminfo", "ready")
    try:
        first = inside.until_ready()
        outside.end()  # the exporter lets go and ends; the importer holds the memory
        time.sleep(0.5)
        held = gpu_used(gpu) - before
        inside.go_on()
        second = inside.until_ready()
    finally:
        inside.end()
        if outside.proc.poll() is None:
            outside.end()
    infos = [s["used"] for s in first + second if s.get("op") == "meminfo"]
    ok = (rcs(first, "import") == [0] and rcs(first, "map") == [0] and rcs(first, "create") == [OOM]
          and infos == [256 * MiB + GiB] * 2 and held >= GiB)
    return report("memory imported from another process is charged to the importer, also after the exporter ends",
                  ok, {"gpu_mib_held_by_importer": held // MiB, "steps": steps + inside.steps})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index = CUDA ordinal of the GPU (default 0)")
    args = parser.parse_args()
    if not VMM.exists():
        raise SystemExit(f"{VMM} is missing: run `make native` first")
    work = Path(tempfile.mkdtemp(prefix="gs-lifetime-"))
    records = [check(work, args.gpu) for check in (vmm_sample, pools, stack, imported)]
    save(records, "lifetime_checks.jsonl")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
