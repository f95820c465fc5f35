"""`devplugin demo`: the real daemon on a simulated node (fake driver, 4 x 15 GiB) against a kubelet emulator.

It prints what a user checks on a real node: the node's allocatable, which GPU each container got and the env
and mounts it received, and the clear errors for requests that cannot be honoured; first with binpack, then
with spread.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from devplugin import contract
from devplugin.allocation.units import decode_id
from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import AdmissionError, ContainerResult, KubeletEmulator
from devplugin_sim.pods import ContainerSpec, PodSpec

DOMAIN = "aliyun.com"
MEM, CORE, COUNT = (f"{DOMAIN}/gpu-mem", f"{DOMAIN}/gpu-core.percentage", f"{DOMAIN}/gpu-count")
SHOWN_ENVS = ("NVIDIA_VISIBLE_DEVICES", "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_CONTAINER",
              "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")

EXAMPLES = [
    ("cuda-sample", {MEM: 2, CORE: 30}, "the seed's job: 2 GiB and 30 % of one GPU"),
    ("infer-a", {MEM: 4, CORE: 20}, "a small inference server"),
    ("infer-b", {MEM: 8, CORE: 40}, "a bigger one"),
    ("train", {MEM: 12, CORE: 50}, "needs most of a GPU"),
    ("exclusive", {COUNT: 1}, "one whole GPU, no sharing"),
    ("bad-core", {MEM: 1, CORE: 33}, "33 % is not a multiple of 5: refused"),
    ("too-big", {MEM: 16, CORE: 10}, "16 GiB: no 15 GiB GPU can hold it: refused"),
]


def _say(text: str = "") -> None:
    print(text, flush=True)


REPO = Path(__file__).resolve().parents[1]
SHIM_LIB = REPO / "build" / "shim" / "libgpushare.so"
PROBE = REPO / "build" / "shim" / "tests" / "gs_probe"
FAKE_CUDA = REPO / "build" / "fakes" / "libcuda.so.1"
FAKE_NVML = REPO / "build" / "fakes" / "libnvidia-ml.so.1"


def _shim_built() -> bool:
    return all(p.exists() for p in (SHIM_LIB, PROBE, FAKE_CUDA, FAKE_NVML))


def _start_daemon(driver: FakeDriver, plugin_dir: Path, pod_resources: Path, placement: str,
                  log_path: Path, shim_state: Path) -> subprocess.Popen:
    env = {**os.environ, **driver.env(), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "devplugin", "serve", "--mode", "core_mem", "--placement", placement,
           "--plugin-dir", str(plugin_dir), "--pod-resources-socket", str(pod_resources), "--node-name", "",
           "--health-port", "0", "--state-dir", str(shim_state.parent / "state")]
    if _shim_built():
        cmd += ["--shim", "on", "--shim-lib", str(SHIM_LIB), "--shim-state-dir", str(shim_state)]
    else:
        cmd += ["--shim", "off"]
    return subprocess.Popen(cmd, env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT)


def _show_allocatable(kubelet: KubeletEmulator) -> None:
    alloc = kubelet.allocatable()
    cap = kubelet.capacity()
    _say("  node status (as `kubectl get node -o yaml` would show it):")
    for res in sorted(cap):
        _say(f"    {res}: capacity {cap[res]}, allocatable {alloc.get(res, 0)}")


def _show_usage(kubelet: KubeletEmulator, uuids: list[str]) -> None:
    """Per GPU, what the admitted containers hold (from the kubelet's own allocations)."""
    used: Counter[tuple[str, str]] = Counter()  # (GPU UUID, resource) -> devices
    for containers in kubelet.allocations().values():
        for resources in containers.values():
            used.update((decode_id(dev)[0], res) for res, ids in resources.items() for dev in ids)
    totals = Counter((decode_id(dev)[0], res) for res in (MEM, CORE, COUNT) for dev in kubelet.devices(res))
    _say("  per GPU, held by containers (what `kubectl inspect gpushare` would show):")
    for i, gpu in enumerate(uuids):
        u = {res: used[gpu, res] for res in (MEM, CORE, COUNT)}
        t = {res: totals[gpu, res] for res in (MEM, CORE, COUNT)}
        whole = " (whole, gpu-count)" if u.get(COUNT) else ""
        _say(f"    GPU{i}: gpu-mem {u.get(MEM, 0):>2}/{t.get(MEM, 0)} GiB, "
             f"gpu-core {u.get(CORE, 0):>3}/{t.get(CORE, 0)} %{whole}")


def _show_inside(driver: FakeDriver, c: ContainerResult) -> None:
    """Run a CUDA program under the shim with what the container received, as the container would."""
    mounts = {m.container_path: m.host_path for m in c.mounts}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPUSHARE_", "LD_PRELOAD"))}
    env.update(driver.env())
    env.update(c.envs)
    env.update({
        "LD_PRELOAD": mounts[contract.CONTAINER_LIB_PATH],
        contract.ENV_LIMITS_FILE: mounts[contract.CONTAINER_LIMITS_PATH],
        contract.ENV_SHARED_CACHE: str(Path(mounts[contract.CONTAINER_STATE_DIR]) / "usage.cache"),
        contract.ENV_REAL_LIBCUDA: str(FAKE_CUDA), contract.ENV_REAL_LIBNVML: str(FAKE_NVML),
        "GS_PROBE_LIBCUDA": str(FAKE_CUDA), "GS_PROBE_LIBNVML": str(FAKE_NVML),
    })
    steps = ["init", "ctx", "0", "meminfo", "nvml", "0", "fill", "alloc", "64m", "meminfo"]
    proc = subprocess.run([str(PROBE), "gpa", *steps], env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        _say(f"      (the CUDA probe failed: {proc.stderr.strip()})")
        return
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    by_op: dict[str, list[dict]] = {}
    for step in out:
        by_op.setdefault(step["op"], []).append(step)
    mib = 1 << 20
    first, nvml, fill = by_op["meminfo"][0], by_op.get("nvml", [{}])[0], by_op["fill"][0]
    _say("      inside the container, under the shim (a CUDA program on the simulated 15 GiB GPU):")
    _say(f"        cuMemGetInfo: total {first['total'] // mib} MiB, free {first['free'] // mib} MiB")
    if "total" in nvml:
        _say(f"        NVML (what nvidia-smi shows): total {nvml['total'] // mib} MiB")
    _say(f"        allocating 64 MiB blocks: {fill['bytes'] // mib} MiB granted, then error {fill['rc']} "
         "(CUDA_ERROR_OUT_OF_MEMORY)")


def _admit_examples(kubelet: KubeletEmulator, driver: FakeDriver) -> list[str]:
    admitted = []
    for name, limits, what in EXAMPLES:
        pod = PodSpec(name=name, containers=[ContainerSpec(name="main", limits=dict(limits))])
        asked = ", ".join(f"{r.split('/')[1]}={v}" for r, v in limits.items())
        try:
            result = kubelet.admit(pod)
        except AdmissionError as exc:
            _say(f"  x {name:<12} ({asked}; {what})")
            _say(f"      refused: {exc}")
            continue
        admitted.append(pod.uid)
        c = result.containers[0]
        _say(f"  + {name:<12} ({asked}; {what})")
        _say(f"      GPU {c.envs.get('ALIYUN_COM_GPU_MEM_IDX', '?')}   order of calls: {', '.join(c.calls)}")
        for key in SHOWN_ENVS:
            if key in c.envs:
                _say(f"      {key}={c.envs[key]}")
        if c.mounts:
            listed = ", ".join(f"{m.container_path} ({'ro' if m.read_only else 'rw'})" for m in c.mounts)
            _say(f"      mounts: {listed}")
        if name == "cuda-sample" and c.mounts and _shim_built():
            _show_inside(driver, c)
    return admitted


def run_demo(keep: bool = False) -> int:
    root = Path(tempfile.mkdtemp(prefix="gsdemo-", dir="/tmp"))
    driver = FakeDriver.create(root / "driver", seed_node(4, 15360))
    plugin_dir = root / "device-plugins"
    pod_resources = root / "pod-resources" / "kubelet.sock"
    log_path = root / "daemon.log"
    status = 0
    try:
        with KubeletEmulator(plugin_dir, pod_resources, seed=7) as kubelet:
            for placement in ("binpack", "spread"):
                _say(f"=== devplugin serve on a simulated node: 4 x 15 GiB GPUs, mode core_mem, {placement} ===")
                daemon = _start_daemon(driver, plugin_dir, pod_resources, placement, log_path, root / "shim")
                ok = kubelet.wait_for(lambda k: {MEM, CORE, COUNT} <= set(k.allocatable()) and
                                      all(k.allocatable()[r] > 0 for r in (MEM, CORE, COUNT)), timeout=30)
                if not ok:
                    _say(f"the daemon did not register in 30 s; its log is {log_path}:")
                    _say(log_path.read_text())
                    daemon.kill()
                    return 1
                _show_allocatable(kubelet)
                _say("  admitting example pods (the kubelet calls each resource in random order):")
                uids = _admit_examples(kubelet, driver)
                _show_usage(kubelet, [g.uuid for g in driver.gpus])
                for uid in uids:
                    kubelet.remove_pod(uid)
                daemon.send_signal(signal.SIGTERM)
                code = daemon.wait(timeout=15)
                left = sorted(p.name for p in plugin_dir.glob(f"{DOMAIN}-*.sock"))
                _say(f"  SIGTERM: daemon exited {code}, its sockets left behind: {left or 'none'}")
                _say()
                status = status or code
        _say(f"daemon log: {log_path}" if keep else "")
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return status
