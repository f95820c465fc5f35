"""What the kubelet's own books say, checked against the project's promises.

Inputs: each node agent's /books (the device manager's devices per pod and container), its checkpoint (the
AllocateResponse the kubelet stored per container and resource: the envs the container is started with) and the
pods' `gpushare.io/allocated` records. Each check returns the violations it found, one sentence each, naming the
node, pod, container and GPU.
"""

from __future__ import annotations

import base64
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from devplugin import contract as c
from devplugin.api.deviceplugin.v1beta1 import api_pb2
from devplugin.deviceplugin.device_list import VOLUME_MOUNT_ROOT

ACTIVE = ("Pending", "Running", "")


@dataclass(frozen=True)
class Unit:
    """One device ID of ours: GPU UUID, kind (m: 1 gpu-mem unit, c: 1 % of compute, g: the whole GPU)."""

    uuid: str
    kind: str
    n: int

    @classmethod
    def parse(cls, dev_id: str) -> Unit:
        uuid, _, tail = dev_id.rpartition("::")
        return cls(uuid, tail[0], int(tail[1:] or 0))


@dataclass
class Holding:
    """A container's devices on one node, from the agent's books."""

    node: str
    namespace: str
    pod: str
    uid: str
    container: str
    init: bool
    ids: list[str] = field(default_factory=list)

    @property
    def who(self) -> str:
        return f"{self.node}: {self.namespace}/{self.pod} container {self.container!r}"

    def per_gpu(self) -> dict[str, Counter[str]]:
        """GPU UUID -> units held by kind."""
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for dev_id in self.ids:
            u = Unit.parse(dev_id)
            out[u.uuid][u.kind] += 1
        return dict(out)


def holdings(books: dict[str, dict[str, Any]]) -> list[Holding]:
    """Every container of every active pod that holds devices, on every node."""
    out = []
    for node, b in books.items():
        for p in b["pods"]:
            if p.get("phase", "") not in ACTIVE:
                continue
            for ctr in p["containers"]:
                ids = [i for res_ids in (ctr.get("devices") or {}).values() for i in res_ids]
                if ids:
                    out.append(Holding(node, p["namespace"], p["name"], p["uid"], ctr["name"], bool(ctr.get("init")),
                                       ids))
    return out


def double_allocations(books: dict[str, dict[str, Any]]) -> list[str]:
    """No device ID held by two pods; no GPU held whole and sliced at once; no GPU's slices over its size."""
    bad = []
    for node, b in books.items():
        owners: dict[str, set[str]] = defaultdict(set)
        for h in holdings({node: b}):
            for dev_id in h.ids:
                owners[dev_id].add(f"{h.namespace}/{h.pod}")
        for dev_id, pods in sorted(owners.items()):
            if len(pods) > 1:
                bad.append(f"{node}: device {dev_id} held by {len(pods)} pods at once: {sorted(pods)}")
        whole: dict[str, set[str]] = defaultdict(set)
        sliced: dict[str, set[str]] = defaultdict(set)
        per_kind: dict[tuple[str, str], int] = Counter()
        for dev_id, pods in owners.items():
            u = Unit.parse(dev_id)
            (whole if u.kind == "g" else sliced)[u.uuid] |= pods
            per_kind[u.uuid, u.kind] += 1
        for uuid in sorted(set(whole) & set(sliced)):
            bad.append(f"{node}: GPU {uuid} held whole by {sorted(whole[uuid])} and sliced by {sorted(sliced[uuid])}")
        capacity = {res: int(n) for res, n in b["capacity"].items()}
        gpus = max(capacity.get(c.DEFAULT_RESOURCE_DOMAIN + "/" + c.RESOURCE_COUNT, 1), 1)
        mem_per_gpu = capacity.get(c.DEFAULT_RESOURCE_DOMAIN + "/" + c.RESOURCE_MEM, 0) // gpus
        for (uuid, kind), n in sorted(per_kind.items()):
            limit = {"m": mem_per_gpu, "c": c.CORE_PER_GPU, "g": 1}[kind]
            if n > limit:
                bad.append(f"{node}: GPU {uuid} has {n} units of kind {kind} held, more than its {limit}")
    return bad


def splits(books: dict[str, dict[str, Any]], multi_gpu: dict[str, int]) -> list[str]:
    """Every container's memory and compute on one GPU (or evenly on N GPUs for a pod of the multi-GPU label:
    `multi_gpu` maps the pod's UID to N)."""
    bad = []
    for h in holdings(books):
        per_gpu = h.per_gpu()
        if any(k["g"] for k in per_gpu.values()):
            continue
        n = multi_gpu.get(h.uid, 1)
        if len(per_gpu) != n or len({(k["m"], k["c"]) for k in per_gpu.values()}) != 1:
            bad.append(f"{h.who}: split over {len(per_gpu)} GPU(s), {n} asked: "
                       + ", ".join(f"{u}: {k['m']} mem, {k['c']} core" for u, k in sorted(per_gpu.items())))
    return bad


def records_agree(books: dict[str, dict[str, Any]], allocated: dict[str, str]) -> list[str]:
    """Each container's devices equal its pod's gpushare.io/allocated record (`allocated`: pod UID -> the
    annotation's text)."""
    bad = []
    for h in holdings(books):
        text = allocated.get(h.uid)
        if text is None:
            bad.append(f"{h.who}: holds devices but its pod has no {c.ANN_ALLOCATED} record")
            continue
        record = c.parse_assignment(text, c.ANN_ALLOCATED)
        shares = record.containers.get(h.container)
        if shares is None:
            bad.append(f"{h.who}: holds devices but the {c.ANN_ALLOCATED} record has no entry for it")
            continue
        want = {s.uuid: Counter({"g": 1} if s.whole else {"m": s.mem, "c": s.core}) for s in shares}
        got = {u: Counter({k: n for k, n in kinds.items()}) for u, kinds in h.per_gpu().items()}
        if {u: +k for u, k in want.items()} != {u: +k for u, k in got.items()}:
            bad.append(f"{h.who}: the kubelet holds {fmt(got)} but the record says {fmt(want)}")
    return bad


def fmt(per_gpu: dict[str, Counter[str]]) -> str:
    return "; ".join(f"{u}: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items()) if n)
                     for u, kinds in sorted(per_gpu.items())) or "nothing"


def checkpoint_responses(checkpoint: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(pod UID, container) -> resource -> the plugin's AllocateResponse the kubelet stored."""
    out: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for entry in checkpoint["Data"]["PodDeviceEntries"] or []:
        resp = api_pb2.ContainerAllocateResponse()
        resp.ParseFromString(base64.b64decode(entry["AllocResp"] or ""))
        out[entry["PodUID"], entry["ContainerName"]][entry["ResourceName"]] = resp
    return dict(out)


def checkpoint_envs(checkpoint: dict[str, Any]) -> dict[tuple[str, str], dict[str, dict[str, str]]]:
    """(pod UID, container) -> resource -> the envs of the plugin's AllocateResponse the kubelet stored."""
    return {key: {res: dict(resp.envs) for res, resp in per.items()}
            for key, per in checkpoint_responses(checkpoint).items()}


def granted_gpus(resp: Any) -> str:
    """The GPUs an AllocateResponse grants, as NVIDIA_VISIBLE_DEVICES would name them (comma-separated UUIDs):
    the env itself (envvar strategy), or the mounts under /var/run/nvidia-container-devices (volume-mounts: the
    env then names that directory), in the order given."""
    env = dict(resp.envs).get(c.ENV_NVIDIA_VISIBLE_DEVICES, "")
    if env != VOLUME_MOUNT_ROOT:
        return env
    return ",".join(m.container_path[len(VOLUME_MOUNT_ROOT) + 1:] for m in resp.mounts
                    if m.container_path.startswith(VOLUME_MOUNT_ROOT + "/"))


def envs_agree(books: dict[str, dict[str, Any]], checkpoints: dict[str, dict[str, Any]],
               allocated: dict[str, str], mem_unit_mib: int = 1024) -> list[str]:
    """Every env a container is started with (each resource's AllocateResponse, as the kubelet stored it) agrees
    with its pod's gpushare.io/allocated record: the GPUs it sees, its memory limit per GPU, its compute limit."""
    bad = []
    for h in holdings(books):
        text = allocated.get(h.uid)
        if text is None:
            continue  # records_agree reports it
        shares = c.parse_assignment(text, c.ANN_ALLOCATED).containers.get(h.container)
        if not shares:
            continue
        per_resource = checkpoint_responses(checkpoints[h.node]).get((h.uid, h.container), {})
        if not per_resource:
            bad.append(f"{h.who}: no AllocateResponse in the kubelet's checkpoint")
        gpus = ",".join(s.uuid for s in shares)
        want = {}
        if not shares[0].whole:
            for i, s in enumerate(shares):
                want[f"{c.ENV_MEMORY_LIMIT}_{i}"] = f"{s.mem * mem_unit_mib}m"
            want[c.ENV_ALIYUN_MEM_CONTAINER] = str(sum(s.mem for s in shares))
            if shares[0].core:
                want[c.ENV_SM_LIMIT] = str(shares[0].core)
        for resource, resp in sorted(per_resource.items()):
            envs = dict(resp.envs)
            for key, value in sorted(want.items()):
                if key in envs and envs[key] != value:
                    bad.append(f"{h.who}: {resource} gave {key}={envs[key]}, its record says {value}")
            if c.ENV_NVIDIA_VISIBLE_DEVICES not in envs:
                bad.append(f"{h.who}: {resource} gave no {c.ENV_NVIDIA_VISIBLE_DEVICES}")
            elif granted_gpus(resp) != gpus:
                bad.append(f"{h.who}: {resource} granted GPUs {granted_gpus(resp)!r} "
                           f"({c.ENV_NVIDIA_VISIBLE_DEVICES}={envs[c.ENV_NVIDIA_VISIBLE_DEVICES]}), "
                           f"its record says {gpus}")
    return bad


def free_room(books: dict[str, Any]) -> dict[str, tuple[int, int, bool]]:
    """One node's GPUs: UUID -> (free gpu-mem units, free compute %, untouched) from the kubelet's books."""
    capacity = {res: int(n) for res, n in books["capacity"].items()}
    healthy = books["healthy"].get(c.DEFAULT_RESOURCE_DOMAIN + "/" + c.RESOURCE_COUNT, [])
    gpus = [Unit.parse(i).uuid for i in healthy]
    mem_per_gpu = capacity.get(c.DEFAULT_RESOURCE_DOMAIN + "/" + c.RESOURCE_MEM, 0) // max(len(gpus), 1)
    used: dict[str, Counter[str]] = defaultdict(Counter)
    for dev_id in {i for h in holdings({"": books}) for i in h.ids}:  # an init container's IDs reused: once
        u = Unit.parse(dev_id)
        used[u.uuid][u.kind] += 1
    out = {}
    for uuid in gpus:
        k = used.get(uuid, Counter())
        if k["g"]:
            out[uuid] = (0, 0, False)
        else:
            out[uuid] = (mem_per_gpu - k["m"], c.CORE_PER_GPU - k["c"], not (k["m"] or k["c"]))
    return out


def inspect_json_disagreements(report: dict[str, Any], books: dict[str, dict[str, Any]]) -> list[str]:
    """`devplugin inspect -o json` against the kubelets' books: per GPU, the memory and compute held, whether it
    is held whole, and which app containers (and sidecars) hold it."""
    bad = []
    seen = {n["name"] for n in report["nodes"]}
    for node in sorted(set(books) - seen):
        bad.append(f"inspect does not show node {node}")
    for n in report["nodes"]:
        if n["name"] not in books:
            continue
        held: dict[str, Counter[str]] = defaultdict(Counter)
        who: dict[str, set[str]] = defaultdict(set)
        for dev_id in {i for h in holdings({n["name"]: books[n["name"]]}) for i in h.ids}:
            u = Unit.parse(dev_id)
            held[u.uuid][u.kind] += 1
        on_node = holdings({n["name"]: books[n["name"]]})
        for h in on_node:
            if h.init and all(any(x.uid == h.uid and not x.init and i in x.ids for x in on_node) for i in h.ids):
                continue  # an init container whose devices an app container reuses: shown once, under the app
            for uuid in h.per_gpu():
                who[uuid].add(f"{h.namespace}/{h.pod}/{h.container}")
        for g in n["gpus"]:
            k = held.get(g["uuid"], Counter())
            want = (k["m"] if not k["g"] else g["memTotal"], k["c"] if not k["g"] else g["coreTotal"], bool(k["g"]))
            got = (g["memAllocated"], g["coreAllocated"], bool(g["whole"]))
            if want != got:
                bad.append(f"{n['name']} GPU {g['index']}: inspect shows mem/core/whole {got}, the kubelet holds "
                           f"{want}")
            pods = {f"{p['namespace']}/{p['name']}/{p['container']}" for p in g["pods"]}
            if pods != who.get(g["uuid"], set()):
                bad.append(f"{n['name']} GPU {g['index']}: inspect lists {sorted(pods)}, the kubelet "
                           f"{sorted(who.get(g['uuid'], set()))}")
    return bad


def inspect_text_disagreements(text: str, report: dict[str, Any]) -> list[str]:
    """The text report's per-GPU rows (MEMORY used/total, CORE used/total or whole, PODS) against the JSON's."""
    bad = []
    lines = text.splitlines()
    for n in report["nodes"]:
        try:
            start = next(i for i, line in enumerate(lines) if line.split()[:1] == [n["name"]])
        except StopIteration:
            bad.append(f"text report has no block for node {n['name']}")
            continue
        # the table starts at its header row (after any "!" lines: a problem, use unknown); columns by name, since
        # the figures of use (USED) come and go with the daemons' answers
        head = next((i for i in range(start + 1, len(lines)) if lines[i].split()[:1] == ["GPU"]), None)
        if head is None:
            bad.append(f"text report has no GPU table for node {n['name']}")
            continue
        names = lines[head].split()
        at = [next(i for i, c in enumerate(names) if c.startswith(x)) for x in ("MEMORY", "CORE", "PODS")]
        rows = {}
        for line in lines[head + 1: head + 1 + len(n["gpus"])]:
            cells = line.split()
            rows[cells[0]] = [cells[i] for i in at]
        for g in n["gpus"]:
            core = "whole" if g["whole"] else f"{g['coreAllocated']}/{g['coreTotal']}"
            want = [f"{g['memAllocated']}/{g['memTotal']}", core, str(len(g["pods"]))]
            if rows.get(str(g["index"])) != want:
                bad.append(f"{n['name']} GPU {g['index']}: text row {rows.get(str(g['index']))}, JSON {want}")
    return bad
