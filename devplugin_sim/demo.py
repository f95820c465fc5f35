"""`devplugin demo`: the real node daemon on a simulated node, linked to a (fake) apiserver, under a kubelet emulator.

The node has 4 x 15 GiB GPUs (fake driver) and the label ack.node.gpu.schedule=core_mem. Each example pod is
created in the apiserver bound to the node, then admitted by the kubelet, which calls `devplugin serve` over the
device-plugin gRPC sockets. The demo prints what a user checks on a real node: the node's allocatable, what each
container received (env, mounts, and under the shim what CUDA reports), the Events and annotations the daemon
writes (which GPU each pod got, a scheduler's choice honoured, why a pod was refused), and a whole GPU leaving
the shared pool and coming back. Then the node is relabelled from binpack to spread and the daemon follows.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from devplugin import contract as c
from devplugin_sim.demo_cluster import NAMESPACE, NODE, DemoCluster, until
from devplugin_sim.demo_inside import SHIM_LIB, inside_view, shim_built
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import AdmissionError, ContainerResult, KubeletEmulator

DOMAIN = c.DEFAULT_RESOURCE_DOMAIN
MEM, CORE, COUNT = (f"{DOMAIN}/{c.RESOURCE_MEM}", f"{DOMAIN}/{c.RESOURCE_CORE}", f"{DOMAIN}/{c.RESOURCE_COUNT}")
SHORT = {MEM: "mem", CORE: "core", COUNT: "count"}
WIDTH = 80
GPU_MIB = 15360
SHOWN_ENVS = ("NVIDIA_VISIBLE_DEVICES", "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_CONTAINER",
              "CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")
PINNED_GPU = 3  # binpack alone would pick GPU 2 here: the choice is visibly honoured


@dataclass
class Example:
    name: str
    limits: dict[str, int]
    what: str
    annotations: dict[str, str] = field(default_factory=dict)
    detail: bool = False  # print every env and mount (and the view under the shim)


def _say(text: str = "", indent: int = 0, hang: int = 2) -> None:
    """Print wrapped to 80 columns; continuation lines indented `hang` more."""
    pad = " " * indent
    print(textwrap.fill(text, WIDTH, initial_indent=pad, subsequent_indent=pad + " " * hang,
                        break_long_words=True, break_on_hyphens=False) if text else "", flush=True)


def _asked(limits: dict[str, int]) -> str:
    return ", ".join(f"gpu-{SHORT[r]} {v}" for r, v in limits.items())


def _scheduled(uuid: str) -> dict[str, str]:
    """What a scheduler extender writes before its Binding: GPU PINNED_GPU for container "main"."""
    share = c.GpuShare(index=PINNED_GPU, uuid=uuid, mem=4, core=20)
    return {c.ANN_SCHEDULED: c.PodAssignment(node=NODE, time_ns=time.time_ns(), containers={"main": (share,)}).render()}


def _examples(uuids: list[str]) -> list[Example]:
    return [
        Example("cuda-sample", {MEM: 2, CORE: 30}, "the seed's job", detail=True),
        Example("infer-a", {MEM: 4, CORE: 20}, "a small inference server"),
        Example("infer-b", {MEM: 8, CORE: 40}, "a bigger one"),
        Example("train", {MEM: 12, CORE: 50}, "needs most of a GPU"),
        Example("notebook", {MEM: 1}, "memory only: placed alone"),
        Example("pinned", {MEM: 4, CORE: 20}, f"the scheduler chose GPU {PINNED_GPU}",
                annotations=_scheduled(uuids[PINNED_GPU])),
        Example("exclusive", {COUNT: 1}, "one whole GPU, no sharing"),
        Example("bad-core", {MEM: 1, CORE: 33}, "33 % is not a multiple of 5"),
        Example("too-big", {MEM: 16, CORE: 10}, "no 15 GiB GPU holds 16 GiB"),
    ]


# --- one pod ------------------------------------------------------------------------------------------------
def _show_granted(cl: DemoCluster, ex: Example, got: ContainerResult) -> None:
    event = cl.wait_event(ex.name, "Normal")
    if event is not None:
        _say(f"Event Normal {event['reason']}: {event['message']}", 6, 4)
    else:
        _say("(no GPUAssigned Event within 5 s: the daemon could not name the pod in time; see its log)", 6, 4)
    if ex.detail:
        _show_detail(cl, ex, got)
        return
    limits = [f"{k}={got.envs[k]}" for k in ("CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT") if k in got.envs]
    _say(f"env: NVIDIA_VISIBLE_DEVICES=GPU {got.envs.get('ALIYUN_COM_GPU_MEM_IDX', '?')}'s UUID"
         + (", " + ", ".join(limits) if limits else ""), 6, 4)


def _show_detail(cl: DemoCluster, ex: Example, got: ContainerResult) -> None:
    """The kubelet's calls, every env and mount, the annotations written, and the view under the shim."""
    calls = ", ".join(f"{call.split()[0].replace('Allocation', '')} {SHORT.get(call.split()[1], '?')}"
                      for call in got.calls)
    _say(f"the kubelet's calls, in its random order: {calls}", 6, 4)
    for key in SHOWN_ENVS:
        if key in got.envs:
            _say(f"{key}={got.envs[key]}", 6, 4)
    if got.mounts:
        listed = ", ".join(f"{m.container_path} ({'ro' if m.read_only else 'rw'})" for m in got.mounts)
        _say(f"mounts: {listed}", 6, 4)
    record = until(lambda: cl.allocated(ex.name), 5)
    if record is not None:
        ann = cl.api.pod(NAMESPACE, ex.name)["metadata"].get("annotations") or {}
        shown = json.dumps(json.loads(record.render()), separators=(", ", ": "))
        _say(f"annotations written: {c.ANN_ALLOCATED}: {shown}", 6, 4)
        _say(f"{c.ANN_ALIYUN_MEM_IDX}: {ann.get(c.ANN_ALIYUN_MEM_IDX)}, "
             f"{c.ANN_ALIYUN_ASSIGNED}: {ann.get(c.ANN_ALIYUN_ASSIGNED)}", 8, 4)
    if got.mounts and shim_built():
        _say("inside the container, under the shim (a CUDA program, 15 GiB GPU):", 6)
        for line in inside_view(cl.driver, got):
            _say(line, 8, 2)


def _show_refused(cl: DemoCluster, ex: Example, exc: AdmissionError) -> None:
    code = re.search(r"code = (\w+)", str(exc))
    _say(f"the daemon refused it ({code.group(1) if code else 'error'}), so the kubelet fails the pod "
         f"({exc.reason}). `kubectl describe pod {ex.name}` shows:", 6, 4)
    event = cl.wait_event(ex.name, "Warning")
    if event is None:
        _say(f"(no Warning Event within 5 s; the kubelet said: {exc})", 8, 2)
        return
    _say(f"Warning  {event['reason']}  {event['message']}", 8, 2)


def _admit(cl: DemoCluster, ex: Example) -> dict | None:
    """Create the pod bound to the node, let the kubelet admit it, print what happened; the pod if admitted."""
    pod = cl.create_pod(ex.name, ex.limits, ex.annotations)
    try:
        got = cl.admit(pod).containers[0]
    except AdmissionError as exc:
        _say(f"x {ex.name:<12} {_asked(ex.limits)}: {ex.what}", 2, 4)
        _show_refused(cl, ex, exc)
        return None
    _say(f"+ {ex.name:<12} {_asked(ex.limits)}: {ex.what}", 2, 4)
    _show_granted(cl, ex, got)
    return pod


# --- the node -----------------------------------------------------------------------------------------------
def _show_node_status(cl: DemoCluster) -> None:
    cap, alloc = cl.kubelet.capacity(), cl.kubelet.allocatable()
    _say("node status (as `kubectl get node -o yaml` shows it):", 2)
    for res in sorted(cap):
        _say(f"{res}: capacity {cap[res]}, allocatable {alloc.get(res, 0)}", 4)


def _show_per_gpu(cl: DemoCluster, pods: list[dict]) -> None:
    """Pods by name on each GPU, from what the daemon wrote: each pod's gpushare.io/allocated annotation and the
    node's gpushare.io/gpu-usage annotation."""
    names = [p["metadata"]["name"] for p in pods]

    def settled() -> c.NodeUsage | None:
        usage = cl.node_usage()
        if usage is None or sum(u.containers for u in usage.gpus.values()) != len(names):
            return None
        return usage if all(cl.allocated(n) for n in names) else None

    usage = until(settled, 10) or cl.node_usage()
    on_gpu: dict[int, list[str]] = {}
    for name in names:
        record = cl.allocated(name)
        for shares in (record.containers.values() if record else ()):
            for share in shares:
                on_gpu.setdefault(share.index, []).append(name)
    _say(f"per GPU (the node's {c.ANN_NODE_USAGE} annotation; pods by their {c.ANN_ALLOCATED} "
         "annotation):", 2, 2)
    for index in range(len(cl.driver.gpus)):
        u = usage.gpus.get(index, c.GpuUsage()) if usage else c.GpuUsage()
        room = "whole (gpu-count)".ljust(19) if u.whole else f"{u.mem:>2}/15 GiB {u.core:>3}/100 %"
        _say(f"GPU {index}  {room}  {', '.join(on_gpu.get(index, [])) or '-'}", 4, 28)


def _allocatable_row(kubelet: KubeletEmulator, when: str) -> None:
    a = kubelet.allocatable()
    _say(f"{when:<22}{a.get(MEM, 0):>9}{a.get(CORE, 0):>10}{a.get(COUNT, 0):>11}", 4)


def _show_whole_gpu_cycle(cl: DemoCluster, exclusive: dict | None, before: dict[str, int]) -> None:
    """The kubelet's allocatable before the gpu-count pod, while it runs, then after it ends."""
    if exclusive is None:
        _say("(the gpu-count pod was not admitted: nothing to take out of the shared pool)", 2)
        return
    record = cl.allocated(exclusive["metadata"]["name"])
    held = ", ".join(f"GPU {s.index}" for shares in (record.containers.values() if record else ()) for s in shares)
    _say(f"a whole GPU leaves the shared pool and comes back: while exclusive holds {held or 'its GPU'} its gpu-mem "
         "and gpu-core units are Unhealthy in ListAndWatch (and a GPU holding slices has its gpu-count device "
         "Unhealthy), so the scheduler stops counting them:", 2, 2)
    _say(f"{'allocatable':<22}{'gpu-mem':>9}{'gpu-core':>10}{'gpu-count':>11}", 4)
    _say(f"{'before exclusive':<22}{before.get(MEM, 0):>9}{before.get(CORE, 0):>10}{before.get(COUNT, 0):>11}", 4)
    out = {MEM: before.get(MEM, 0) - GPU_MIB // 1024, CORE: before.get(CORE, 0) - c.CORE_PER_GPU}
    cl.kubelet.wait_for(lambda k: all(k.allocatable().get(r) == n for r, n in out.items()), timeout=5)
    _allocatable_row(cl.kubelet, "while exclusive runs")
    cl.end_pod(exclusive)
    cl.kubelet.wait_for(lambda k: all(k.allocatable().get(r) == before.get(r) for r in (MEM, CORE)), timeout=5)
    _allocatable_row(cl.kubelet, "after it ended")


# --- rounds -------------------------------------------------------------------------------------------------
def _wait_ready(cl: DemoCluster, placement: str, timeout: float = 30) -> bool:
    t0 = time.monotonic()

    def ready() -> bool:
        registered = all(cl.kubelet.allocatable().get(r, 0) > 0 for r in (MEM, CORE, COUNT))
        raw = (cl.api.node(NODE)["metadata"].get("annotations") or {}).get(c.ANN_NODE_GPUS)
        inv = c.parse_inventory(raw) if raw else None
        return registered and inv is not None and inv.placement == placement and cl.readyz()[0] == 200

    if not until(ready, timeout):
        return False
    _say(f"ready in {time.monotonic() - t0:.1f} s: GET /readyz -> 200 {cl.readyz()[1]}", 2)
    return True


def _binpack_round(cl: DemoCluster) -> list[dict]:
    uuids = [g.uuid for g in cl.driver.gpus]
    _show_node_status(cl)
    _say()
    _say("pods, each created in the apiserver bound to the node, then admitted by the kubelet:", 2)
    admitted: list[dict] = []
    exclusive: dict | None = None
    before_exclusive: dict[str, int] = {}
    for ex in _examples(uuids):
        if ex.limits.get(COUNT):
            before_exclusive = cl.kubelet.allocatable()
        pod = _admit(cl, ex)
        if pod is not None:
            admitted.append(pod)
            if ex.limits.get(COUNT):
                exclusive = pod
    _say()
    _show_per_gpu(cl, admitted)
    _say()
    _show_whole_gpu_cycle(cl, exclusive, before_exclusive)
    for pod in admitted:
        cl.delete_pod(pod)
    return admitted


def _spread_round(cl: DemoCluster) -> None:
    _say("the same shared pods again, and one that Alibaba's scheduler extender placed "
         f"({c.ANN_ALIYUN_MEM_IDX}=3):", 2, 2)
    admitted = []
    examples = [Example(ex.name + "-2", ex.limits, ex.what) for ex in _examples([g.uuid for g in cl.driver.gpus])[:4]]
    examples.append(Example("ali-pinned", {MEM: 2}, "", {c.ANN_ALIYUN_MEM_IDX: "3",  # spread alone: GPU 0
                                                        c.ANN_ALIYUN_ASSUME_TIME: str(time.time_ns()),
                                                        c.ANN_ALIYUN_ASSIGNED: "false"}))
    for ex in examples:
        pod = cl.create_pod(ex.name, ex.limits, ex.annotations)
        try:
            got = cl.admit(pod).containers[0]
        except AdmissionError as exc:
            _say(f"x {ex.name} refused: {exc}", 4, 4)
            continue
        admitted.append(pod)
        _say(f"+ {ex.name:<14} {_asked(ex.limits):<24} -> GPU {got.envs.get('ALIYUN_COM_GPU_MEM_IDX', '?')}", 4)
    _show_per_gpu(cl, admitted)
    for pod in admitted:
        cl.delete_pod(pod)


def _run(cl: DemoCluster) -> int:
    _say("=== devplugin serve: simulated node, 4 x 15 GiB GPUs, core_mem, binpack ===")
    _say(f"node {NODE} in a fake apiserver, labelled {c.LABEL_MODE}=core_mem and {c.LABEL_PLACEMENT}=binpack; "
         "a kubelet emulator admits its pods over the device-plugin gRPC", 2, 2)
    _say(" ".join(cl.serve()), 2, 4)
    if not _wait_ready(cl, "binpack"):
        return _failed(cl, "the daemon did not become ready in 30 s")
    _binpack_round(cl)
    _say()
    _say("=== relabel: ack.node.gpu.placement=spread ===")
    until(lambda: (u := cl.node_usage()) is not None and not any(g.containers for g in u.gpus.values()), 10)
    cl.label_node({c.LABEL_PLACEMENT: "spread"})
    event = cl.wait_event(NODE, "Warning")
    if event is not None:
        _say(f"`kubectl describe node` shows: Warning  {event['reason']}  {event['message']}", 2, 4)
    if not _wait_ready(cl, "spread"):
        return _failed(cl, "the daemon did not follow the relabel in 30 s")
    _spread_round(cl)
    _say()
    code = cl.stop_daemon()
    left = sorted(p.name for p in cl.kubelet.plugin_dir.glob(f"{DOMAIN}-*.sock"))
    _say(f"SIGTERM: daemon exited {code}, its sockets left behind: {', '.join(left) or 'none'}")
    return code


def _failed(cl: DemoCluster, why: str) -> int:
    _say(f"{why}; the daemon's log ({cl.log_path}):")
    cl.kill_daemon()
    print(cl.log_path.read_text(errors="replace")[-4000:], flush=True)
    return 1


def run_demo(keep: bool = False) -> int:
    root = Path(tempfile.mkdtemp(prefix="gsdemo-", dir="/tmp"))
    driver = FakeDriver.create(root / "driver", seed_node(4, GPU_MIB))
    if shim_built():
        shim_args = ["--shim", "on", "--shim-lib", str(SHIM_LIB), "--shim-state-dir", str(root / "shim")]
    else:
        shim_args = ["--shim", "off"]
    status = 1
    try:
        with FakeApiserver() as api, KubeletEmulator(root / "device-plugins", root / "pod-resources" / "kubelet.sock",
                                                     seed=7) as kubelet:
            api.add_node(NODE, labels={c.LABEL_MODE: "core_mem", c.LABEL_PLACEMENT: "binpack"})
            cl = DemoCluster(root, driver, api, kubelet, shim_args)
            try:
                status = _run(cl)
            finally:
                cl.kill_daemon()
        if keep:
            _say(f"daemon log: {root / 'daemon.log'}")
    finally:
        driver.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return status

