"""Containers sharing one simulated GPU under the real shim: run them and measure the GPU time each one got.

Each container is one or more `gs_probe` processes (build/shim/tests) launching kernels in a loop, with the shim
preloaded, its own usage file and its compute share (`CUDA_DEVICE_SM_LIMIT`, `GPU_CORE_UTILIZATION_POLICY`).
The fake libcuda runs every process's kernels on one shared timeline (fakes/fake_gpu_timeline.h) and the fake
NVML reports the processes under host pids that differ from their own. What each container got is read from
the timeline's per-process busy time (`FakeDriver.process_times`), independent of what the shim measured.
Used by tests/shim/test_share*.py and bench/shim_share.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from devplugin import contract
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, seed_uuid

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "build"
SHIM = BUILD / "shim" / "test" / "libgpushare.so"  # the test build: it loads the fake drivers named in the env
PROBE = BUILD / "shim" / "tests" / "gs_probe"
FAKE_CUDA = BUILD / "fakes" / "libcuda.so.1"
FAKE_NVML = BUILD / "fakes" / "libnvidia-ml.so.1"

# Env a container process must not inherit from whoever runs this.
_SCRUB = ("CUDA_", "GPUSHARE_", "GPU_CORE_", "LIBCUDA_", "FAKE_", "LD_PRELOAD", "GS_PROBE_")


@dataclass(frozen=True)
class Workload:
    """The kernels every process launches: `grid` blocks of `ns_per_block` each, back to back."""

    grid: int = 1000
    ns_per_block: int = 1000
    queue_us: int = 20000  # work a process may have queued before a launch blocks
    context_ms: int = 0  # how long creating a context takes


@dataclass
class Container:
    """One container on the GPU: its share (100 = no limit), policy, processes and when it starts."""

    name: str
    share: int = 100
    policy: str = "force"
    processes: int = 1
    shim: bool = True
    env: dict[str, str] = field(default_factory=dict)  # extra settings of its processes
    limits_file: str = ""  # the daemon's limits file for it (GPUSHARE_LIMITS_FILE): it wins over share and policy
    pids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.share <= 100:
            raise ValueError(f"container {self.name}: share {self.share} is not a percentage 1..100")
        if self.processes < 1:
            raise ValueError(f"container {self.name}: needs at least one process, not {self.processes}")


def require_built() -> None:
    missing = [p for p in (SHIM, PROBE, FAKE_CUDA, FAKE_NVML) if not p.exists()]
    if missing:
        raise FileNotFoundError(f"not built: {', '.join(map(str, missing))}; run `make native`")


def make_gpu(directory: Path, sample_period_ms: int = 50, resident_samples: bool = False) -> FakeDriver:
    """A node with one simulated GPU (132 SMs) whose NVML reports host pids (pid + 100000); resident_samples: its
    per-process samples each name the one process resident on the GPU (FakeDriver.create)."""
    gpu = FakeGPU(index=0, uuid=seed_uuid(0, "share"), name="NVIDIA H100 80GB HBM3", memory_mib=81920, minor=0,
                  pci_bus_id="00000000:01:00.0", sms=132)
    return FakeDriver.create(directory, [gpu], sample_period_ms=sample_period_ms, resident_samples=resident_samples)


class Run:
    """Containers running on one fake GPU; `busy()` reads what each has had so far."""

    def __init__(self, driver: FakeDriver, work: Path, workload: Workload, seconds: float) -> None:
        self.driver = driver
        self.work = work
        self.workload = workload
        self.seconds = seconds
        self.procs: list[subprocess.Popen] = []
        self.containers: list[Container] = []
        (work / "gpu-locks").mkdir(parents=True, exist_ok=True)

    def env(self, c: Container) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
        env.update(self.driver.env())
        state = self.work / c.name
        state.mkdir(parents=True, exist_ok=True)
        env.update({
            "GS_PROBE_LIBCUDA": str(FAKE_CUDA),
            contract.ENV_REAL_LIBCUDA: str(FAKE_CUDA),
            contract.ENV_REAL_LIBNVML: str(FAKE_NVML),
            contract.ENV_SHARED_CACHE: str(state / "usage.cache"),
            contract.ENV_CONTEXT_RESERVE: "0",
            contract.ENV_GPU_LOCK_DIR: str(self.work / "gpu-locks"),
            "FAKE_CUDA_NS_PER_BLOCK": str(self.workload.ns_per_block),
            "FAKE_CUDA_QUEUE_US": str(self.workload.queue_us),
            "FAKE_CUDA_CONTEXT_DELAY_MS": str(self.workload.context_ms),
            contract.ENV_SM_LIMIT: str(c.share),
            contract.ENV_CORE_POLICY: c.policy,
        })
        if c.limits_file:
            env[contract.ENV_LIMITS_FILE] = c.limits_file
        if c.shim:
            env["LD_PRELOAD"] = str(SHIM)
        env.update(c.env)
        return env

    def start(self, c: Container, seconds: float | None = None) -> None:
        ms = int((self.seconds if seconds is None else seconds) * 1000)
        for _ in range(c.processes):
            p = subprocess.Popen([str(PROBE), "gpa", "init", "ctx", "0", "launchfor", "launch", str(ms),
                                  str(self.workload.grid), "stats", "0"], env=self.env(c), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            self.procs.append(p)
            c.pids.append(p.pid)
        self.containers.append(c)

    def busy(self) -> dict[str, int]:
        """GPU time (ns) each container's processes have had so far."""
        by_pid = {t.pid: t.busy_ns for t in self.driver.process_times(0)}
        return {c.name: sum(by_pid.get(pid, 0) for pid in c.pids) for c in self.containers}

    def finish(self) -> list[str]:
        """Wait for every process; their stdout (the probe's JSON lines), in start order."""
        outs = []
        for p in self.procs:
            out, err = p.communicate(timeout=self.seconds + 30)
            if p.returncode != 0:
                raise RuntimeError(f"gs_probe failed ({p.returncode}): {err[-2000:]}")
            outs.append(out + err)
        return outs

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def shares(before: dict[str, int], after: dict[str, int], seconds: float) -> dict[str, float]:
    """Percent of the GPU each container had between two `busy()` readings `seconds` apart."""
    return {name: 100.0 * (after[name] - before.get(name, 0)) / (seconds * 1e9) for name in after}


def measure_steady(driver: FakeDriver, work: Path, containers: list[Container], settle: float, window: float,
                   workload: Workload = Workload()) -> dict[str, float]:
    """Start the containers together, let the shares settle, and return each one's share of the GPU over the
    following window (percent)."""
    require_built()
    run = Run(driver, work, workload, settle + window + 0.3)
    try:
        for c in containers:
            run.start(c)
        time.sleep(settle)
        t0, before = time.monotonic(), run.busy()
        time.sleep(window)
        got = shares(before, run.busy(), time.monotonic() - t0)
        run.finish()
        return got
    finally:
        run.stop()


@dataclass
class Reclaim:
    alone: float  # the bursting container's share while it was alone (percent)
    reclaim_s: float | None  # seconds from the neighbour's start until it had its share (None: never)
    after: dict[str, float]  # each container's share once both ran, after reclaiming
    trace: list[tuple[float, dict[str, float]]]  # (seconds since the neighbour started, shares per 100 ms)


def measure_reclaim(driver: FakeDriver, work: Path, burster: Container, neighbour: Container, alone: float,
                    together: float, workload: Workload = Workload(), tick: float = 0.1,
                    tolerance: float = 5.0) -> Reclaim:
    """`burster` runs alone for `alone` seconds, then `neighbour` starts. The reclaim time is how long it takes
    until the neighbour's share over two consecutive ticks reaches its own share minus `tolerance` points."""
    require_built()
    run = Run(driver, work, workload, alone + together + 0.5)
    try:
        run.start(burster)
        time.sleep(alone / 2)
        t0, b0 = time.monotonic(), run.busy()
        time.sleep(alone / 2)
        alone_share = shares(b0, run.busy(), time.monotonic() - t0)[burster.name]
        run.start(neighbour, seconds=together)
        start = time.monotonic()
        trace: list[tuple[float, dict[str, float]]] = []
        prev_t, prev = start, run.busy()
        while time.monotonic() - start < together - tick:
            time.sleep(tick)
            now_t, now = time.monotonic(), run.busy()
            trace.append((now_t - start, shares(prev, now, now_t - prev_t)))
            prev_t, prev = now_t, now
        want = neighbour.share - tolerance
        reclaim_s = None
        for i in range(1, len(trace)):
            if trace[i - 1][1][neighbour.name] >= want and trace[i][1][neighbour.name] >= want:
                reclaim_s = trace[i - 1][0]
                break
        tail = trace[len(trace) // 2:]
        after = {name: sum(s[name] for _, s in tail) / len(tail) for name in (burster.name, neighbour.name)}
        run.finish()
        return Reclaim(alone_share, reclaim_s, after, trace)
    finally:
        run.stop()
