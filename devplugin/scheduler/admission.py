"""The admission webhooks' rules as plain functions of a pod (apiserver JSON).

validate: what the node daemon could not honour, refused at the door with what to change.
mutate: containers that ask for no GPU get NVIDIA_VISIBLE_DEVICES=void, so a CUDA image's `all` does not show
every GPU of the node to a CPU container; opt out with the label gpushare.io/visible-devices=keep on the pod
(or on its namespace: the webhook configuration's namespaceSelector leaves such namespaces out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from devplugin.allocation import unreserved
from devplugin.allocation.requests import PodRequestError, check_core, per_gpu_share, pod_request, resource_names
from devplugin.bounded import RefusedValue, whole_quantity
from devplugin.contract import (
    DEFAULT_RESOURCE_DOMAIN,
    ENV_NVIDIA_VISIBLE_DEVICES,
    LABEL_ACK_MULTI_GPU,
    LABEL_VOID_OPT_OUT,
    VOID_OPT_OUT_VALUE,
)

VOID = "void"
# The env names the node daemon owns: a GPU is granted (and limited) through them, so no container of any pod,
# with or without a GPU request, may set them itself.
RESERVED_ENV_EXACT = (ENV_NVIDIA_VISIBLE_DEVICES, "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                      "GPU_CORE_UTILIZATION_POLICY", "LIBCUDA_LOG_LEVEL")
SLICE_ONLY_ENV = ("LD_PRELOAD",)  # reserved in containers that ask for our GPUs (the shim comes first)
RESERVED_ENV_PREFIXES = ("CUDA_DEVICE_", "GPUSHARE_", "ALIYUN_COM_GPU_MEM_", "NVIDIA_VISIBLE_")
NO_GPU_VALUES = (VOID, "none", "")  # NVIDIA_VISIBLE_DEVICES values that grant nothing (the mutating webhook's)
CONTAINER_FIELDS = ("initContainers", "containers", "ephemeralContainers")
COMPUTE_SHARE_MODE = unreserved.MODE  # nodes that hold containers to compute shares (validate's compute_shares)
# A denial lists this many problems and counts the rest, and every name it repeats is clipped: a pod of many
# containers or env entries, or of long names, must not make a message larger than the pod (each problem repeats
# its container's name).
MAX_LISTED_PROBLEMS = 20
NAME_SHOWN = 63
UNLISTED = ""  # a problem past the listed ones: counted, its text never written


def clip(text: str, limit: int = NAME_SHOWN) -> str:
    """`text` as a message shows it: at most `limit` characters, then how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _listed(problems: list[str]) -> str:
    shown = [p for p in problems if p][:MAX_LISTED_PROBLEMS]  # UNLISTED ones are empty
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f"; and {more} more problem{'s' if more > 1 else ''} like these" if more else "")


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    patch: list[dict] = field(default_factory=list)
    rules: tuple[str, ...] = ()  # a short code for each rule a denied pod breaks (metrics: denials by rule)


def _containers(pod: Mapping, fields: tuple[str, ...] = ("initContainers", "containers")
                ) -> list[tuple[str, int, Mapping]]:
    spec = pod.get("spec") or {}
    return [(f, i, c) for f in fields for i, c in enumerate(spec.get(f) or []) if isinstance(c, Mapping)]


def reserved(name: str) -> bool:
    """An env name the node daemon owns."""
    return name in RESERVED_ENV_EXACT or name.startswith(RESERVED_ENV_PREFIXES)


def _prefix_may_reach_reserved(prefix: str) -> bool:
    """Whether `prefix` + some key can spell a reserved name (an envFrom prefix is glued to each key)."""
    return any(n.startswith(prefix) or prefix.startswith(n) for n in RESERVED_ENV_EXACT + RESERVED_ENV_PREFIXES)


def env_problems(pod: Mapping, namespace_opted_out: bool = False, domain: str = DEFAULT_RESOURCE_DOMAIN
                 ) -> list[str]:
    """Every container (init, app, ephemeral) of any pod that sets an env name the node daemon owns, by `env` or by
    an `envFrom` whose names the webhook cannot read. NVIDIA_VISIBLE_DEVICES=void (or none) grants nothing and is
    allowed on containers that ask for no GPU of ours (the mutating webhook sets it). An `envFrom` is allowed when
    its `prefix` cannot spell a reserved name, and on containers that ask for no GPU when the mutating webhook's
    NVIDIA_VISIBLE_DEVICES=void covers them (an `env` entry wins over `envFrom`). Past the first
    MAX_LISTED_PROBLEMS, a problem is counted as UNLISTED (''), its text not written."""
    problems: list[str] = []
    pod_opted_out = opted_out(pod) or namespace_opted_out
    for field_name, i, spec in _containers(pod, CONTAINER_FIELDS):
        where = f"{field_name}[{i}] {clip(str(spec.get('name', '')))!r}"
        ours = _asks_ours(spec, domain)
        for e in spec.get("env") or []:
            if not isinstance(e, Mapping):
                continue
            name = str(e.get("name", ""))
            if not reserved(name) and not (ours and name in SLICE_ONLY_ENV):
                continue
            if (name == ENV_NVIDIA_VISIBLE_DEVICES and not ours and "valueFrom" not in e
                    and str(e.get("value", "")).strip().lower() in NO_GPU_VALUES):
                continue
            if len(problems) >= MAX_LISTED_PROBLEMS:  # counted, not written: a denial lists the first ones only
                problems.append(UNLISTED)
                continue
            problems.append(f"{where}: sets env {clip(name)}, which only the node daemon may set (it grants and "
                            "limits GPUs); remove it from the pod spec")
        voided = not ours and not pod_opted_out
        for src in spec.get("envFrom") or []:
            if not isinstance(src, Mapping):
                continue
            prefix = str(src.get("prefix") or "")
            if voided or (prefix and not _prefix_may_reach_reserved(prefix)):
                continue
            if len(problems) >= MAX_LISTED_PROBLEMS:
                problems.append(UNLISTED)
                continue
            ref = src.get("configMapRef") or src.get("secretRef") or {}
            kind = "ConfigMap" if "configMapRef" in src else "Secret"
            ref_name = clip(str(ref.get("name", "")))
            problems.append(f"{where}: envFrom {kind} {ref_name!r} could set env names only the node "
                            "daemon may set (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_*, ...), which "
                            "the webhook cannot read; give it a prefix (for example APP_) or list the variables "
                            "under env")
    return problems


def validate_update(pod: Mapping, old: Mapping, domain: str = DEFAULT_RESOURCE_DOMAIN) -> Verdict:
    """An UPDATE: a container's env cannot change once the pod exists, so only ephemeral containers added now (by
    `kubectl debug`, the pods/ephemeralcontainers subresource) are checked."""
    before = {str(c.get("name")) for _, _, c in _containers(old, ("ephemeralContainers",))}
    added = [c for _, _, c in _containers(pod, ("ephemeralContainers",)) if str(c.get("name")) not in before]
    probe = {"metadata": pod.get("metadata") or {}, "spec": {"ephemeralContainers": added}}
    problems = env_problems(probe, domain=domain)
    if problems:
        return Verdict(False, _listed(problems), rules=("reserved_env",))
    return Verdict(True)


def _asks_ours(spec: Mapping, domain: str = DEFAULT_RESOURCE_DOMAIN) -> bool:
    res = spec.get("resources") or {}
    keys = list((res.get("limits") or {}).keys()) + list((res.get("requests") or {}).keys())
    return any(k in resource_names(domain) for k in keys)


def validate(pod: Mapping, largest_gpu_units: int = 0, namespace_opted_out: bool = False,
             domain: str = DEFAULT_RESOURCE_DOMAIN, compute_shares: bool = False) -> Verdict:
    """Allow or deny a pod; every denial lists each problem with what to change. `compute_shares`: some node of
    the cluster holds containers to compute shares (core_mem): a container that asks for gpu-mem alone is allowed
    (it may land on a cgpu or share node) and told, in a warning, what it gets on such a node."""
    env = env_problems(pod, namespace_opted_out, domain)
    try:
        req = pod_request(pod, domain)
    except PodRequestError as exc:
        return Verdict(False, _listed([str(exc), *env]), rules=("pod_request",) + (("reserved_env",) if env else ()))
    problems: list[str] = list(env)
    rules: list[str] = ["reserved_env"] * len(env)

    def deny(rule: str, problem: str) -> None:
        problems.append(problem)
        rules.append(rule)

    names = resource_names(domain)
    n = req.gpus_per_container
    for _, _, spec in _containers(pod):
        cname = clip(str(spec.get("name", "")))
        res = spec.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for full in names:
            if full in requests and full not in limits:
                deny("requests_only", f"container {cname!r}: {full} is set in requests only; set it in limits "
                     "(extended resources need requests equal to limits)")
            elif full in requests and _differ(requests[full], limits[full]):
                deny("request_not_limit", f"container {cname!r}: {full} request {clip(str(requests[full]))} differs "
                     f"from its limit {clip(str(limits[full]))}; set them equal")
    warnings: list[str] = []
    for c in req.gpu_containers:
        where = f"container {clip(c.name)!r}"
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
            if compute_shares and not c.core:
                warnings.append(unreserved_warning(c.name, names[1]))
    if problems:
        return Verdict(False, _listed(problems), rules=tuple(dict.fromkeys(rules)))
    return Verdict(True, warnings=tuple(dict.fromkeys(warnings)))


def unreserved_warning(container: str, core_resource: str) -> str:
    """What a container asking for gpu-mem and no compute gets on a core_mem node (allocation/unreserved.py): the
    node daemon's and the extender's rule, told at creation (which node the pod goes to is not known yet)."""
    return (f"container {container!r} asks for gpu-mem without {core_resource}: on a core_mem node it reserves no "
            "compute and runs only on compute nobody reserved (at most what was unreserved on its GPU when it was "
            "placed, giving way to containers with a compute share; never on a GPU whose compute is all reserved); "
            f"add {core_resource} to reserve compute")


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


def mutate(pod: Mapping, namespace_labels: Mapping[str, str] | None = None, old: Mapping | None = None) -> list[dict]:
    """JSON Patch (RFC 6902) setting NVIDIA_VISIBLE_DEVICES=void on containers that ask for no GPU and do not
    set it themselves; [] when the pod or namespace opts out. Idempotent. On an UPDATE (`old` given: an ephemeral
    container added by `kubectl debug`) only the ephemeral containers that are new are patched."""
    if opted_out(pod, namespace_labels):
        return []
    ops: list[dict] = []
    existing = {str(c.get("name")) for _, _, c in _containers(old, ("ephemeralContainers",))} if old else set()
    fields = ("ephemeralContainers",) if old is not None else CONTAINER_FIELDS
    for field_name, i, spec in _containers(pod, fields):
        if str(spec.get("name")) in existing or _asks_gpu(spec):
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
