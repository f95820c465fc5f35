"""The admission webhooks' rules as plain functions of a pod (apiserver JSON).

validate: what the node daemon could not honour, refused at the door with what to change (a malformed or
contradictory GPU selection included: gpu_selection.py; whether some node has the GPUs it names is the
extender's filter's question, as the webhook does not know the cluster).
mutate: containers that ask for no GPU get NVIDIA_VISIBLE_DEVICES=void, so a CUDA image's `all` does not show
every GPU of the node to a CPU container. A container asks for a GPU only with a non-zero quantity of a GPU
resource (a zero makes no device plugin call and sets no env). Only a cluster admin can opt out, by labelling a
namespace gpushare.io/visible-devices=keep (the webhook configurations' namespaceSelector leaves it out); nothing a
tenant writes in its pod does.
validate_void: the same rule checked by a webhook that fails closed, so a CPU container cannot be created without
the void when the mutating webhook (which fails open) did not run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from devplugin.allocation import unreserved
from devplugin.allocation.gpu_selection import SelectionError, read_selection
from devplugin.allocation.requests import PodRequestError, check_core, per_gpu_share, pod_request, resource_names
from devplugin.bounded import RefusedValue, whole_quantity
from devplugin.contract import (
    DEFAULT_RESOURCE_DOMAIN,
    ENV_NVIDIA_VISIBLE_DEVICES,
    LABEL_ACK_MULTI_GPU,
    LABEL_VOID_OPT_OUT,
    VOID_OPT_OUT_VALUE,
)
from devplugin.deviceplugin.device_list import VOLUME_MOUNT_ROOT

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
        voided = not ours and not namespace_opted_out
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


def _asked(spec: Mapping) -> dict[str, object]:
    """The extended resources a container asks for with a non-zero quantity (limits, then requests): a zero (`0`,
    `0m`, `0Ki`) makes no device plugin call and sets no env, so it asks for nothing. A quantity the bounded
    reader refuses counts as asked (the apiserver has already refused the truly malformed ones)."""
    res = spec.get("resources") or {}
    out: dict[str, object] = {}
    for part in ("requests", "limits"):
        for k, v in (res.get(part) or {}).items() if isinstance(res.get(part), Mapping) else ():
            try:
                zero = whole_quantity(v, str(k)) == 0
            except RefusedValue:
                zero = False
            if zero:
                out.pop(str(k), None)
            else:
                out[str(k)] = v
    return out


def _asks_ours(spec: Mapping, domain: str = DEFAULT_RESOURCE_DOMAIN) -> bool:
    return any(k in resource_names(domain) for k in _asked(spec))


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
    if req.gpu_containers:
        try:
            read_selection(req.annotations)
        except SelectionError as exc:
            deny("gpu_selection", str(exc))
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
    """A non-zero quantity of any GPU-like extended resource (ours or another vendor's): its device plugin grants
    the GPUs, so its visible devices are left alone."""
    return any("gpu" in k.lower() or k.startswith("nvidia.com/") for k in _asked(spec))


def opted_out(namespace_labels: Mapping[str, str] | None) -> bool:
    """The namespace's admin opted its pods out of the void (a pod's own labels cannot: a tenant writes them)."""
    return (namespace_labels or {}).get(LABEL_VOID_OPT_OUT) == VOID_OPT_OUT_VALUE


def _new_containers(pod: Mapping, old: Mapping | None) -> list[tuple[str, int, Mapping]]:
    """The containers a CREATE brings (all of them) or an UPDATE adds (ephemeral containers not in `old`)."""
    existing = {str(c.get("name")) for _, _, c in _containers(old, ("ephemeralContainers",))} if old else set()
    fields = ("ephemeralContainers",) if old is not None else CONTAINER_FIELDS
    return [(f, i, c) for f, i, c in _containers(pod, fields) if str(c.get("name")) not in existing]


def _visible_devices(spec: Mapping) -> Mapping | None:
    """The container's own NVIDIA_VISIBLE_DEVICES entry, if its env has one."""
    for e in spec.get("env") or []:
        if isinstance(e, Mapping) and e.get("name") == ENV_NVIDIA_VISIBLE_DEVICES:
            return e
    return None


def mutate(pod: Mapping, namespace_labels: Mapping[str, str] | None = None, old: Mapping | None = None) -> list[dict]:
    """JSON Patch (RFC 6902) setting NVIDIA_VISIBLE_DEVICES=void on containers that ask for no GPU and do not
    set it themselves; [] when the namespace opts out. Idempotent. On an UPDATE (`old` given: an ephemeral
    container added by `kubectl debug`) only the ephemeral containers that are new are patched."""
    if opted_out(namespace_labels):
        return []
    ops: list[dict] = []
    for field_name, i, spec in _new_containers(pod, old):
        if _asks_gpu(spec) or _visible_devices(spec) is not None:
            continue
        env = spec.get("env")
        item = {"name": ENV_NVIDIA_VISIBLE_DEVICES, "value": VOID}
        if env is None:
            ops.append({"op": "add", "path": f"/spec/{field_name}/{i}/env", "value": [item]})
        else:
            ops.append({"op": "add", "path": f"/spec/{field_name}/{i}/env/-", "value": item})
    return ops


def validate_void(pod: Mapping, old: Mapping | None = None) -> Verdict:
    """Every new container that asks for no GPU carries NVIDIA_VISIBLE_DEVICES with a value that grants nothing
    (the mutating webhook's void), and no container of any pod mounts anything where the toolkit's volume-mounts
    strategy reads its grant (only a device plugin's AllocateResponse may put mounts there). Called by a webhook
    that fails closed and leaves out only the namespaces an admin opted out, as the mutating one does."""
    problems: list[str] = []
    for field_name, i, spec in _new_containers(pod, old):
        where = f"{field_name}[{i}] {clip(str(spec.get('name', '')))!r}"
        for vm in spec.get("volumeMounts") or []:
            path = str(vm.get("mountPath", "")) if isinstance(vm, Mapping) else ""
            if path.rstrip("/") == VOLUME_MOUNT_ROOT or path.startswith(VOLUME_MOUNT_ROOT + "/"):
                problems.append(f"{where}: mounts a volume at {clip(path)}, where the NVIDIA container toolkit reads "
                                "which GPUs a container is granted; only the GPU device plugin may put mounts there: "
                                "remove the volumeMount and ask for a GPU resource instead")
        if _asks_gpu(spec):
            continue
        e = _visible_devices(spec)
        value = None if e is None or "valueFrom" in e else str(e.get("value", "")).strip().lower()
        if value not in NO_GPU_VALUES:
            problems.append(f"{where} asks for no GPU but is not marked {ENV_NVIDIA_VISIBLE_DEVICES}=void: the "
                            "mutating webhook visible-devices.gpushare.io did not run (is the devplugin-scheduler "
                            "service up?); create the pod again, or set the env yourself")
    if problems:
        return Verdict(False, _listed(problems), rules=("void",))
    return Verdict(True)
