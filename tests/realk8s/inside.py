"""What a workload saw inside its container (the workload probe's JSON, tests/realk8s/workload/probe.py), and the
checks of it against what the pod asked for and what its node recorded. Each check returns the mismatches it found,
one sentence each; `pod_sees_what_it_was_given` checks every container of a pod in one call."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from devplugin import contract
from tests.realk8s.cluster import Cluster
from tests.realk8s.images import TOOLS_IN_IMAGE, WORKLOAD_IMAGE
from tests.realk8s.podspecs import CORE, COUNT, MEM, recorded

GiB = 1 << 30
MiB = 1 << 20
# What the shim charges a process for its CUDA context on each GPU, before creating it (GPUSHARE_CONTEXT_RESERVE's
# default, docs/reference/shim.md "The context charge"): the runtime's free memory in a fresh process is its slice
# less this.
CONTEXT_CHARGE = 256 * MiB


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


# --- a whole pod, against what it asked for and what its node recorded ------------------------------------------

def _limits_of(c: k8s.V1Container) -> tuple[int, int, int]:
    """A container's (gpu-mem, gpu-core.percentage, gpu-count); a zero quantity asks for nothing."""
    lim = (c.resources.limits if c.resources else None) or {}
    return int(lim.get(MEM, 0) or 0), int(lim.get(CORE, 0) or 0), int(lim.get(COUNT, 0) or 0)


def _multi_gpu(p: k8s.V1Pod) -> int:
    """The pod's multi-GPU count (ACK's label or the project's annotation; 1 without either)."""
    raw = ((p.metadata.labels or {}).get(contract.LABEL_ACK_MULTI_GPU)
           or (p.metadata.annotations or {}).get(contract.ANN_MULTI_GPU) or "1")
    return int(raw)


def _prints_its_view(c: k8s.V1Container) -> bool:
    """The container's own process is the workload probe: its view is the first line of its output."""
    if c.command:
        return any(arg.endswith("/probe.py") for arg in c.command)
    return bool(c.image == WORKLOAD_IMAGE)


def container_view(cluster: Cluster, ns: str, pod: str, c: k8s.V1Container, running: bool) -> View:
    """What the container sees: the view its workload probe printed, or (a container running something else) the
    workload probe run in it now, as `kubectl exec` runs it."""
    if _prints_its_view(c):
        return View(cluster.probe(ns, pod, c.name))
    if not running:
        raise AssertionError(f"{ns}/{pod} container {c.name!r} runs no workload probe and has ended: nothing to ask")
    res = cluster.exec(ns, pod, c.name, ["env", "PROBE_EXIT=0", "python", f"{TOOLS_IN_IMAGE}/probe.py"])
    for line in res["stdout"].splitlines():
        if line.startswith('{"probe"'):
            return View(json.loads(line)["probe"])
    raise AssertionError(f"the workload probe run in {ns}/{pod} container {c.name!r} printed no view: {res}")


def sees_whole(v: View, uuids: list[str], memory: dict[str, int]) -> list[str]:
    """A container granted whole GPUs (gpu-count): exactly those, each all of its memory (`memory`: UUID -> bytes)
    free and total in NVML, nvidia-smi and the CUDA runtime, and nothing of the shim: no preload, no limits."""
    bad = []
    if sorted(v.nvml_uuids) != sorted(uuids):
        bad.append(f"NVML shows GPUs {v.nvml_uuids}, granted {uuids} whole")
    if sorted(v.smi_uuids) != sorted(uuids):
        bad.append(f"nvidia-smi shows GPUs {v.smi_uuids}, granted {uuids} whole")
    for g in v.raw["nvml"].get("gpus", []):
        want = memory.get(g["uuid"])
        if (int(g["total"]), int(g["free"])) != (want, want):
            bad.append(f"NVML says GPU {g['uuid']} has {g['free']} of {g['total']} bytes free, the whole GPU is {want}")
    smi = dict(zip(v.smi_uuids, v.smi_totals_mib, strict=False))
    for uuid, mib in smi.items():
        if memory.get(uuid) is not None and mib != memory[uuid] >> 20:
            bad.append(f"nvidia-smi says GPU {uuid} has {mib} MiB, the whole GPU is {memory[uuid] >> 20}")
    whole = memory.get(v.nvml_uuids[0]) if v.nvml_uuids else None
    meminfo = v.runtime_step("meminfo") or {}
    if (meminfo.get("total"), meminfo.get("free")) != (whole, whole):
        bad.append(f"the CUDA runtime (cudaMemGetInfo) says {meminfo.get('free')} of {meminfo.get('total')} bytes "
                   f"free, the whole GPU is {whole}: {v.raw['runtime']}")
    if v.shim_loaded or v.raw["preload"]:
        bad.append(f"the shim is preloaded into a container of whole GPUs (/etc/ld.so.preload: {v.raw['preload']})")
    if v.raw["limits"] is not None:
        bad.append(f"a container of whole GPUs has a limits file: {v.limits}")
    capped = sorted(k for k in v.env if k == contract.ENV_SM_LIMIT or k.startswith(contract.ENV_MEMORY_LIMIT))
    if capped:
        bad.append(f"a container of whole GPUs is given caps in its env: {capped}")
    return bad


def sees_free(v: View, memory: int) -> list[str]:
    """Nothing of a share is in use when its workload starts: NVML says all `memory` bytes of each GPU are free, and
    the CUDA runtime all of them less its own context (the shim's context charge)."""
    bad = []
    meminfo = v.runtime_step("meminfo") or {}
    if meminfo.get("free") != memory - CONTEXT_CHARGE:
        bad.append(f"the CUDA runtime (cudaMemGetInfo) says {meminfo.get('free')} bytes free of a fresh {memory}, "
                   f"{memory - CONTEXT_CHARGE} with its context charged")
    for g in v.raw["nvml"].get("gpus", []):
        if int(g["free"]) != memory:
            bad.append(f"NVML says {g['free']} bytes free on GPU {g['uuid']} of a fresh {memory}")
    return bad


def sees_compute(v: View, uuids: list[str], sm_limit: int | None, unreserved: bool) -> list[str]:
    """The compute the container may take: `sm_limit` percent in the limits file and CUDA_DEVICE_SM_LIMIT on each
    of `uuids`, and `sm_unreserved=1` exactly when it reserved none (gpu-mem alone on a core_mem node: its cap is
    the compute nobody had reserved when it was placed, `sm_limit` None when that figure is not known here)."""
    bad = []
    lim = v.limits
    caps = set()
    for uuid in uuids:
        dev = next((k.rsplit(".", 1)[0] for k, val in lim.items() if k.endswith(".uuid") and val == uuid), None)
        if dev is None:
            continue  # sees_slice names it
        flag = lim.get(f"{dev}.sm_unreserved", "0") == "1"
        if flag != unreserved:
            bad.append(f"the limits file says sm_unreserved={int(flag)} for {uuid}, "
                       + ("it reserved no compute" if unreserved else "it reserved its compute"))
        cap = int(lim.get(f"{dev}.sm_limit", "100"))
        caps.add(cap)
        if unreserved and not 1 <= cap <= contract.CORE_PER_GPU:
            bad.append(f"the limits file caps {uuid} at sm_limit {cap}, not a share of a GPU")
    env = v.env.get(contract.ENV_SM_LIMIT)
    if sm_limit is not None and env != str(sm_limit):
        bad.append(f"{contract.ENV_SM_LIMIT}={env}, granted {sm_limit} %")
    if sm_limit is None and (env is None or {int(env)} != caps):
        bad.append(f"{contract.ENV_SM_LIMIT}={env}, the limits file's sm_limit {sorted(caps)}")
    return bad


def pod_sees_what_it_was_given(cluster: Cluster, pod: k8s.V1Pod, unreserved: Mapping[str, int] | None = None,
                               record_wait: float = 15.0) -> list[str]:
    """Every container of a Running pod (init containers, sidecars, app containers) against what it asked for and
    what its node recorded for it (gpushare.io/allocated): a share sees exactly the GPUs of its record, each with
    its gpu-mem in bytes (a multi-GPU pod's split evenly) all free, the shim preloaded with its compute share (a
    container that asked for memory alone: the compute nobody had reserved, `unreserved[container]` where the
    test knows it, and sm_unreserved=1); whole GPUs (gpu-count) are seen whole, uncapped, without the shim; a
    container that asked for no GPU sees none. The mismatches, one sentence each, naming pod and container."""
    ns, name = pod.metadata.namespace, pod.metadata.name
    deadline = time.monotonic() + record_wait
    while True:  # the node daemon writes the record just after admission: a pod can be Running a moment before
        p = cluster.core.read_namespaced_pod(name, ns)
        if recorded(p) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if p.status.phase != "Running":
        return [f"{ns}/{name} is {p.status.phase} ({p.status.reason}: {p.status.message}), not Running"]
    raw = (p.metadata.annotations or {}).get(contract.ANN_ALLOCATED)
    record = contract.parse_assignment(raw, contract.ANN_ALLOCATED).containers if raw else {}
    node = cluster.node(p.spec.node_name)
    memory = {g.uuid: g.memory_mib << 20 for g in node.driver.gpus}
    inventory = contract.parse_inventory(cluster.core.read_node(node.name).metadata.annotations[contract.ANN_NODE_GPUS])
    unit = inventory.mem_unit_mib << 20
    n = _multi_gpu(p)
    statuses = {s.name: s for s in (p.status.init_container_statuses or []) + (p.status.container_statuses or [])}
    bad = []
    for c in (p.spec.init_containers or []) + p.spec.containers:
        who = f"{ns}/{name} container {c.name!r}"
        st = statuses.get(c.name)
        running = bool(st and st.state and st.state.running)
        try:
            view = container_view(cluster, ns, name, c, running)
        except AssertionError as exc:
            bad.append(f"{who}: {exc}")
            continue
        mem, core, count = _limits_of(c)
        if not (mem or core or count):
            bad += [f"{who} asked for no GPU, yet {s}" for s in sees_no_gpu(view)]
            continue
        shares = record.get(c.name)
        if not shares:
            bad.append(f"{who} asked for a GPU but its pod's {contract.ANN_ALLOCATED} record has no entry for it: "
                       f"{raw}")
            continue
        uuids = [s.uuid for s in shares]
        if count:
            if len(shares) != count or not all(s.whole for s in shares):
                bad.append(f"{who} asked for {count} whole GPU(s), its record gives {shares}")
            bad += [f"{who}: {s}" for s in sees_whole(view, uuids, memory)]
            continue
        per_mem, per_core = mem // n, core // n
        if len(shares) != n or any((s.mem, s.core, s.whole) != (per_mem, per_core, False) for s in shares):
            bad.append(f"{who} asked for {mem} gpu-mem / {core} % over {n} GPU(s), its record gives {shares}")
        sm = per_core if core else (unreserved or {}).get(c.name)
        bad += [f"{who}: {s}" for s in sees_slice(view, uuids, per_mem * unit, sm)]
        bad += [f"{who}: {s}" for s in sees_free(view, per_mem * unit)]
        bad += [f"{who}: {s}" for s in sees_compute(view, uuids, sm, unreserved=not core)]
    return bad


def running_pods_see_what_they_were_given(cluster: Cluster, ns: str) -> tuple[int, list[str]]:
    """Every pod of the namespace that is Running and not being deleted, each checked as above: (how many were
    checked, the mismatches)."""
    pods = [p for p in cluster.core.list_namespaced_pod(ns).items
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return len(pods), [bad for p in pods for bad in pod_sees_what_it_was_given(cluster, p)]


@dataclass
class Sampler:
    """Checks a few Running pods of each burst of a churn as it goes (run_churn's `settled`): `per_burst` of them,
    chosen by a seeded generator; the mismatches are kept, not raised, so the churn runs to its end."""

    cluster: Cluster
    seed: int = 0
    per_burst: int = 1
    checked: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def __call__(self, burst: int, pods: list[k8s.V1Pod]) -> None:
        live = sorted((p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None),
                      key=lambda p: str(p.metadata.name))
        for p in self._rng.sample(live, min(self.per_burst, len(live))):
            self.checked.append(p.metadata.name)
            self.found += [f"burst {burst}: {bad}" for bad in pod_sees_what_it_was_given(self.cluster, p)]
