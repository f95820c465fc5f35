"""The admission webhooks' rules as plain functions of a pod (apiserver JSON).

validate: what the node daemon could not honour, refused at the door with what to change.
mutate: containers that ask for no GPU get NVIDIA_VISIBLE_DEVICES=void, so a CUDA image's `all` does not show
every GPU of the node to a CPU container; opt out with the label gpushare.io/visible-devices=keep on the pod
(or on its namespace: the webhook configuration's namespaceSelector leaves such namespaces out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from devplugin.allocation.requests import PodRequestError, check_core, per_gpu_share, pod_request, resource_names
from devplugin.bounded import RefusedValue, whole_quantity
from devplugin.contract import (
    ENV_NVIDIA_VISIBLE_DEVICES,
    LABEL_ACK_MULTI_GPU,
    LABEL_VOID_OPT_OUT,
    VOID_OPT_OUT_VALUE,
)

VOID = "void"
RESERVED_ENV_EXACT = (ENV_NVIDIA_VISIBLE_DEVICES, "LD_PRELOAD")
RESERVED_ENV_PREFIXES = ("CUDA_DEVICE_", "GPUSHARE_")


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    patch: list[dict] = field(default_factory=list)
    rules: tuple[str, ...] = ()  # a short code for each rule a denied pod breaks (metrics: denials by rule)


def _containers(pod: Mapping) -> list[tuple[str, int, Mapping]]:
    spec = pod.get("spec") or {}
    out = [("initContainers", i, c) for i, c in enumerate(spec.get("initContainers") or [])]
    out += [("containers", i, c) for i, c in enumerate(spec.get("containers") or [])]
    return out


def validate(pod: Mapping, largest_gpu_units: int = 0) -> Verdict:
    """Allow or deny a pod; every denial lists each problem with what to change."""
    try:
        req = pod_request(pod)
    except PodRequestError as exc:
        return Verdict(False, str(exc), rules=("pod_request",))
    problems: list[str] = []
    rules: list[str] = []

    def deny(rule: str, problem: str) -> None:
        problems.append(problem)
        rules.append(rule)

    names = resource_names()
    n = req.gpus_per_container
    env_names: dict[str, list[str]] = {}  # container name -> the env names it sets
    for _, _, spec in _containers(pod):
        cname = str(spec.get("name", ""))
        env_names.setdefault(cname, [str(e.get("name", "")) for e in spec.get("env") or [] if isinstance(e, Mapping)])
        res = spec.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for full in names:
            if full in requests and full not in limits:
                deny("requests_only", f"container {cname!r}: {full} is set in requests only; set it in limits "
                     "(extended resources need requests equal to limits)")
            elif full in requests and _differ(requests[full], limits[full]):
                deny("request_not_limit", f"container {cname!r}: {full} request {requests[full]} differs from its "
                     f"limit {limits[full]}; set them equal")
    warnings: list[str] = []
    for c in req.gpu_containers:
        where = f"container {c.name!r}"
        if c.count and (c.mem or c.core):
            deny("count_with_share", f"{where}: gpu-count (whole GPUs) cannot be combined with gpu-mem or "
                 f"gpu-core.percentage; to split a share over N GPUs, label the pod "
                 f"{LABEL_ACK_MULTI_GPU}=N and ask for gpu-mem only")
            continue
        if c.core and not c.mem:
            deny("core_without_mem", f"{where}: gpu-core.percentage needs gpu-mem; add a gpu-mem limit")
        if c.core:
            why = check_core(c.core, n)
            if why:
                deny("core_share", f"{where}: {why}" + (f" (over {n} GPUs)" if n > 1 else ""))
        if c.mem:
            try:
                mem, _ = per_gpu_share(c, n)
            except PodRequestError as exc:
                deny("mem_share", str(exc))
                mem = 0
            if largest_gpu_units and mem > largest_gpu_units:
                per = f" per GPU ({c.mem} over {n} GPUs)" if n > 1 else ""
                deny("larger_than_gpu", f"{where}: asks for {mem} gpu-mem units{per} but the largest GPU in the "
                     f"cluster has {largest_gpu_units}; ask for at most {largest_gpu_units}"
                     + ("" if n > 1 else f" or label the pod {LABEL_ACK_MULTI_GPU}=N to split it"))
            if not largest_gpu_units:
                warnings.append("no node publishes a GPU inventory yet: gpu-mem was not checked against GPU sizes")
            for env in env_names.get(c.name, ()):
                if env in RESERVED_ENV_EXACT or env.startswith(RESERVED_ENV_PREFIXES):
                    deny("reserved_env", f"{where}: sets env {env}, which the node daemon sets for GPU shares; "
                         "remove it from the pod spec")
    if problems:
        return Verdict(False, "; ".join(problems), rules=tuple(dict.fromkeys(rules)))
    return Verdict(True, warnings=tuple(dict.fromkeys(warnings)))


def _differ(request: object, limit: object) -> bool:
    """Whether a request and a limit are different quantities (`10` and `1e1` are the same)."""
    try:
        return whole_quantity(request, "request") != whole_quantity(limit, "limit")
    except RefusedValue:
        return str(request) != str(limit)


def _asks_gpu(spec: Mapping) -> bool:
    """Any GPU-like extended resource (ours or another vendor's): leave its visible devices alone."""
    res = spec.get("resources") or {}
    keys = list((res.get("limits") or {}).keys()) + list((res.get("requests") or {}).keys())
    return any("gpu" in k.lower() or k.startswith("nvidia.com/") for k in keys)


def opted_out(pod: Mapping, namespace_labels: Mapping[str, str] | None = None) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (labels.get(LABEL_VOID_OPT_OUT) == VOID_OPT_OUT_VALUE
            or (namespace_labels or {}).get(LABEL_VOID_OPT_OUT) == VOID_OPT_OUT_VALUE)


def mutate(pod: Mapping, namespace_labels: Mapping[str, str] | None = None) -> list[dict]:
    """JSON Patch (RFC 6902) setting NVIDIA_VISIBLE_DEVICES=void on containers that ask for no GPU and do not
    set it themselves; [] when the pod or namespace opts out. Idempotent."""
    if opted_out(pod, namespace_labels):
        return []
    ops: list[dict] = []
    for field_name, i, spec in _containers(pod):
        if _asks_gpu(spec):
            continue
        env = spec.get("env")
        if any(isinstance(e, Mapping) and e.get("name") == ENV_NVIDIA_VISIBLE_DEVICES for e in env or []):
            continue
        item = {"name": ENV_NVIDIA_VISIBLE_DEVICES, "value": VOID}
        if env is None:
            ops.append({"op": "add", "path": f"/spec/{field_name}/{i}/env", "value": [item]})
        else:
            ops.append({"op": "add", "path": f"/spec/{field_name}/{i}/env/-", "value": item})
    return ops
