"""The contracts, written once: node daemon <-> shim (env, mounts, limits file) and node daemon <-> scheduler
extender <-> inspect (labels and annotations on pods and nodes).

This module is the single source of truth. `shim/gpushare_contract.h` is generated from its shim half
(`python -m devplugin.contract > shim/gpushare_contract.h`, or `make contract`) and a test fails
when the header is stale. The env names are HAMi-core's (so either shim works with our daemon)
plus Alibaba Cloud ACK's `ALIYUN_COM_GPU_MEM_*` names for applications that read them. The cluster half
(labels, annotations and their JSON formats) is documented in docs/reference/contract.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from devplugin import bounded as b

# --- Env set by the daemon on Allocate -------------------------------------------------------
# Which GPU(s) the container sees: GPU UUIDs, comma separated (read by the NVIDIA container runtime).
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# ACK names, for applications that limit themselves (mode `share`) and for cGPU compatibility.
ENV_ALIYUN_MEM_IDX = "ALIYUN_COM_GPU_MEM_IDX"  # GPU index on the node
ENV_ALIYUN_MEM_DEV = "ALIYUN_COM_GPU_MEM_DEV"  # the GPU's total memory, in gpu-mem units
ENV_ALIYUN_MEM_CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"  # this container's memory, in gpu-mem units
ENV_ALIYUN_MEM_UNIT = "ALIYUN_COM_GPU_MEM_UNIT"  # size of one gpu-mem unit, e.g. "GiB" or "512MiB"
# HAMi-core names, read by the shim (and by HAMi-core's libvgpu.so).
ENV_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"  # all devices; per device: CUDA_DEVICE_MEMORY_LIMIT_<i>
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"  # percent of one GPU's compute; 0 or unset = 100
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"  # file where a container's processes account usage
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"  # default | force | disable
ENV_LOG_LEVEL = "LIBCUDA_LOG_LEVEL"  # 0..4
# Our own names.
ENV_LIMITS_FILE = "GPUSHARE_LIMITS_FILE"  # where the read-only limits file is mounted
ENV_REAL_LIBCUDA = "GPUSHARE_REAL_LIBCUDA"  # path of the real libcuda.so.1 (tests point it at the fake)
ENV_REAL_LIBNVML = "GPUSHARE_REAL_LIBNVML"  # path of the real libnvidia-ml.so.1 (tests likewise)
ENV_CONTEXT_RESERVE = "GPUSHARE_CONTEXT_RESERVE"  # device memory charged per process for its CUDA context
ENV_GPU_LOCK_DIR = "GPUSHARE_GPU_LOCK_DIR"  # a directory of <GPU UUID>.lock files shared by a node's containers

CORE_POLICIES = ("default", "force", "disable")

# --- Paths inside the container ---------------------------------------------------------------
CONTAINER_LIB_PATH = "/usr/local/gpushare/lib/libgpushare.so"
CONTAINER_PRELOAD_PATH = "/etc/ld.so.preload"
CONTAINER_LIMITS_PATH = "/etc/gpushare/limits"
CONTAINER_STATE_DIR = "/var/run/gpushare"
CONTAINER_SHARED_CACHE = CONTAINER_STATE_DIR + "/usage.cache"
# The node's per-GPU lock files (read-only; flock works on them): processes of different containers starting on
# one GPU at the same moment take turns to find their NVML pid. Used in place of GPUSHARE_GPU_LOCK_DIR whenever the
# daemon's limits file is mounted.
CONTAINER_GPU_LOCK_DIR = "/var/run/gpushare-locks"

# --- The limits file --------------------------------------------------------------------------
# Text, one `key=value` a line, `#` starts a comment. It wins over every env var above.
#   version=1
#   devices=<n>
#   device.<i>.uuid=GPU-...          container-local ordinal i, matched to CUDA devices by UUID
#   device.<i>.memory_limit=<bytes>  0 = no memory limit
#   device.<i>.sm_limit=<percent>    1..100; 100 = no compute limit
#   device.<i>.sm_unreserved=0|1     1: the container reserved no compute on this GPU (gpu-mem without
#                                    gpu-core.percentage on a core_mem node): sm_limit is the most it may take
#                                    (what nobody had reserved when it was placed), and it takes only what its
#                                    neighbours leave, giving way whenever the GPU is saturated. Absent = 0.
#   core_policy=default|force|disable
LIMITS_VERSION = 1
LIMITS_MAX_DEVICES = 16


# --- The usage file (CUDA_DEVICE_MEMORY_SHARED_CACHE) -----------------------------------------------------------
# Binary, written by the shim's processes of one container (shim/gs_region.h), read by the node daemon for the
# per-container metrics (devplugin/isolation/usage_file.py). Little-endian; the shim asserts these offsets at
# compile time, so a layout change fails to build until this block (and the reader) follows.
#   header  magic u64, version u32, ndevices u32, nslots u32                                      at 0
#   dev[USAGE_DEVICES]    uuid char[USAGE_UUID_LEN] NUL-terminated, limit u64 (bytes)            at USAGE_OFF_DEVICES
#   slots[USAGE_SLOTS]    pid i32 (0 = free), ..., used u64[USAGE_DEVICES] at USAGE_SLOT_USED    at USAGE_OFF_SLOTS
#   compute[USAGE_DEVICES]  at USAGE_OFF_COMPUTE: spent u64 at USAGE_COMPUTE_SPENT (tokens launches used),
#                         used_pct i32 at USAGE_COMPUTE_USED_PCT, steps i32 at USAGE_COMPUTE_STEPS (0: not measured)
#   stats[USAGE_DEVICES]  refused u64 (allocations refused at the cap), refused_bytes u64, throttled_ns u64
#                         (time launches waited for the compute share)                           at USAGE_OFF_STATS
USAGE_MAGIC = 0x3147455248534753
USAGE_VERSION = 3
USAGE_DEVICES = 16
USAGE_SLOTS = 256
USAGE_UUID_LEN = 96
USAGE_OFF_DEVICES = 64
USAGE_DEVICE_SIZE = USAGE_UUID_LEN + 8
USAGE_OFF_SLOTS = USAGE_OFF_DEVICES + USAGE_DEVICES * USAGE_DEVICE_SIZE
USAGE_SLOT_SIZE = 192
USAGE_SLOT_USED = 16
USAGE_OFF_COMPUTE = USAGE_OFF_SLOTS + USAGE_SLOTS * USAGE_SLOT_SIZE
USAGE_COMPUTE_SIZE = 128
USAGE_COMPUTE_SPENT = 32
USAGE_COMPUTE_USED_PCT = 100
USAGE_COMPUTE_STEPS = 108
USAGE_OFF_STATS = USAGE_OFF_COMPUTE + USAGE_DEVICES * USAGE_COMPUTE_SIZE
USAGE_STATS_SIZE = 64
USAGE_FILE_SIZE = USAGE_OFF_STATS + USAGE_DEVICES * USAGE_STATS_SIZE


@dataclass(frozen=True)
class DeviceLimit:
    """The limits of one GPU as one container sees it."""

    uuid: str
    memory_limit: int  # bytes, 0 = unlimited
    sm_limit: int = 100  # percent of the GPU
    sm_unreserved: bool = False  # no compute reserved here: sm_limit caps it, and it gives way to its neighbours


@dataclass(frozen=True)
class Limits:
    """Everything the limits file says."""

    devices: tuple[DeviceLimit, ...]
    core_policy: str = "default"


class LimitsFileError(ValueError):
    """A limits file that cannot be trusted; the message says which line and why."""


def render_limits(limits: Limits) -> str:
    """Serialise limits to the text format above."""
    if limits.core_policy not in CORE_POLICIES:
        raise LimitsFileError(f"core_policy {limits.core_policy!r} is not one of {CORE_POLICIES}")
    if not 1 <= len(limits.devices) <= LIMITS_MAX_DEVICES:
        raise LimitsFileError(f"a container has 1..{LIMITS_MAX_DEVICES} devices, not {len(limits.devices)}")
    lines = [f"version={LIMITS_VERSION}", f"devices={len(limits.devices)}"]
    for i, dev in enumerate(limits.devices):
        if dev.memory_limit < 0 or not 1 <= dev.sm_limit <= 100:
            raise LimitsFileError(f"device {i} ({dev.uuid}): memory_limit must be >= 0, sm_limit 1..100")
        lines += [
            f"device.{i}.uuid={dev.uuid}",
            f"device.{i}.memory_limit={dev.memory_limit}",
            f"device.{i}.sm_limit={dev.sm_limit}",
        ]
        if dev.sm_unreserved:
            lines.append(f"device.{i}.sm_unreserved=1")
    lines.append(f"core_policy={limits.core_policy}")
    return "\n".join(lines) + "\n"


def _flag(value: str, key: str) -> bool:
    if int(value) not in (0, 1):
        raise LimitsFileError(f"{key} must be 0 or 1, not {value!r}")
    return int(value) == 1


def parse_limits(text: str) -> Limits:
    """Parse the text format; raise LimitsFileError naming the bad line."""
    values: dict[str, str] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise LimitsFileError(f"line {no}: expected key=value, got {raw!r}")
        values[key.strip()] = value.strip()
    try:
        if int(values.get("version", "0")) != LIMITS_VERSION:
            raise LimitsFileError(f"version must be {LIMITS_VERSION}, got {values.get('version')!r}")
        count = int(values["devices"])
        devices = tuple(
            DeviceLimit(
                uuid=values[f"device.{i}.uuid"],
                memory_limit=int(values[f"device.{i}.memory_limit"]),
                sm_limit=int(values.get(f"device.{i}.sm_limit", "100")),
                sm_unreserved=_flag(values.get(f"device.{i}.sm_unreserved", "0"), f"device.{i}.sm_unreserved"),
            )
            for i in range(count)
        )
    except KeyError as exc:
        raise LimitsFileError(f"missing key {exc.args[0]}") from None
    except ValueError as exc:
        if isinstance(exc, LimitsFileError):
            raise
        raise LimitsFileError(f"not a number: {exc}") from None
    limits = Limits(devices=devices, core_policy=values.get("core_policy", "default"))
    render_limits(limits)  # validates ranges
    return limits


# =============================================================================================================
# The cluster contract: labels and annotations (node daemon, scheduler extender, webhooks, inspect)
# =============================================================================================================

# --- Resources ------------------------------------------------------------------------------------------------
DEFAULT_RESOURCE_DOMAIN = "aliyun.com"
RESOURCE_MEM = "gpu-mem"  # <domain>/gpu-mem: gpu-mem units (GiB by default) of one GPU
RESOURCE_CORE = "gpu-core.percentage"  # <domain>/gpu-core.percentage: percent of one GPU, multiples of 5
RESOURCE_COUNT = "gpu-count"  # <domain>/gpu-count: whole GPUs
CORE_STEP = 5
CORE_PER_GPU = 100

# --- Node labels (set by the operator) ------------------------------------------------------------------------
LABEL_MODE = "ack.node.gpu.schedule"  # core_mem | cgpu | share
LABEL_PLACEMENT = "ack.node.gpu.placement"  # binpack | spread
LABEL_WHOLE_GPUS = "gpushare.io/whole-gpus"  # N: the node's last N GPUs serve gpu-count only, the others slices only
LEGACY_MODE_LABELS = {"gpushare": "share", "cgpu": "cgpu"}  # <label>=true on older nodes
MODES = ("core_mem", "cgpu", "share")
PLACEMENTS = ("binpack", "spread")
# A node serves GPUs either through the device plugin (`devplugin serve`) or through Dynamic Resource Allocation
# (`devplugin dra`), never both: `gpushare.io/allocation=dra` selects DRA; absent (or `device-plugin`), the device
# plugin. Each daemon serves nothing on a node labelled for the other.
LABEL_ALLOCATION = "gpushare.io/allocation"
ALLOCATION_DRA = "dra"
ALLOCATION_DEVICE_PLUGIN = "device-plugin"

# --- Dynamic Resource Allocation (resource.k8s.io/v1): the driver, its devices and their capacities -------------
DRA_DRIVER = "gpu.gpushare.io"  # ResourceSlice spec.driver, the DeviceClasses' driver, the kubelet plugin's name
DRA_CAPACITY_MEMORY = "memory"  # bytes of GPU memory a share takes
DRA_CAPACITY_CORES = "cores"  # percent of the GPU's compute a share takes
DRA_ATTR_TYPE = "type"  # "share" (gpu-N, consumable capacity) or "whole" (gpu-N-whole, exclusive)
DRA_ATTR_MIG_PROFILE = "migProfile"  # a MIG device's profile, "1g.10gb"; absent on a whole GPU
DRA_ATTR_PARENT_UUID = "parentUUID"  # a MIG device's GPU
DRA_ATTR_PARENT_INDEX = "parentIndex"  # a MIG device's GPU's NVML index
DRA_ATTR_NVLINK_ISLAND = "nvlinkIsland"  # GPUs with the same value are joined by NVLink; absent: no NVLink
DRA_ATTR_NUMA_NODE = "numaNode"  # the GPU's NUMA node; absent when NVML and sysfs do not say
DRA_TYPE_SHARE = "share"
DRA_TYPE_WHOLE = "whole"
DRA_TAINT_UNHEALTHY = "gpu.gpushare.io/unhealthy"  # NoSchedule device taint of a GPU the health watcher failed
DRA_CDI_KIND = "gpushare.io/gpu"  # CDI vendor/class of the devices NodePrepareResources names

# --- Pod labels / annotations set by the user -----------------------------------------------------------------
# Multi-GPU sharing: a container's gpu-mem (and gpu-core.percentage) split evenly over N GPUs of one node.
LABEL_ACK_MULTI_GPU = "aliyun.com/gpu-count"  # pod LABEL, ACK's name
ANN_MULTI_GPU = "gpushare.io/gpu-count"  # pod annotation, ours, same meaning
# Choose or avoid GPUs (docs/reference/contract.md, devplugin/allocation/gpu_selection.py): comma-separated
# entries; a model entry matches a GPU whose NVML product name (`model` in ANN_NODE_GPUS) contains it, ignoring
# case; a UUID entry is a whole GPU UUID (GPU-...). Every annotation given must allow a GPU for the pod to use it.
ANN_USE_GPU_MODEL = "gpushare.io/use-gpu-model"
ANN_AVOID_GPU_MODEL = "gpushare.io/avoid-gpu-model"
ANN_USE_GPU_UUID = "gpushare.io/use-gpu-uuid"
ANN_AVOID_GPU_UUID = "gpushare.io/avoid-gpu-uuid"
# HAMi's names for the same four, read as well (both given: they must say the same).
ANN_HAMI_USE_GPU_TYPE = "nvidia.com/use-gputype"
ANN_HAMI_NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
ANN_HAMI_USE_GPU_UUID = "nvidia.com/use-gpuuuid"
ANN_HAMI_NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
# Opt out of NVIDIA_VISIBLE_DEVICES=void for containers that ask for no GPU (label on the pod or namespace).
LABEL_VOID_OPT_OUT = "gpushare.io/visible-devices"
VOID_OPT_OUT_VALUE = "keep"

# --- Pod annotations written by the scheduler extender (at bind) and the node daemon (at Allocate) -----------
ANN_SCHEDULED = "gpushare.io/scheduled"  # the extender's choice (PodAssignment JSON), written before the Binding
ANN_ALLOCATED = "gpushare.io/allocated"  # what the node daemon placed (PodAssignment JSON)
# Alibaba's open-source gpushare protocol (read and written for compatible tools).
ANN_ALIYUN_MEM_IDX = "ALIYUN_COM_GPU_MEM_IDX"  # GPU index (single GPU)
ANN_ALIYUN_MEM_POD = "ALIYUN_COM_GPU_MEM_POD"  # the pod's total gpu-mem
ANN_ALIYUN_MEM_DEV = "ALIYUN_COM_GPU_MEM_DEV"  # gpu-mem of one GPU
ANN_ALIYUN_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"  # "false" at bind, "true" once the node placed it
ANN_ALIYUN_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"  # Unix nanoseconds of the bind
# ACK's scheduler: {"<app container index>": {"<GPU index>": <gpu-mem units>}}
ANN_ACK_ALLOCATION = "scheduler.framework.gpushare.allocation"
ANN_ACK_CORE_ALLOCATION = "gpushare.alibabacloud.com/core-percentage"  # same shape, for gpu-core.percentage
ANN_ACK_ASSIGNED = "scheduler.framework.gpushare.assigned"
ANN_ACK_ASSUME_TIME = "scheduler.framework.gpushare.assume-time"

# --- Node annotations written by the node daemon ----------------------------------------------------------------
ANN_NODE_GPUS = "gpushare.io/gpus"  # NodeInventory JSON: mode, placement, unit, each GPU
ANN_NODE_USAGE = "gpushare.io/gpu-usage"  # NodeUsage JSON: room in use per GPU; changes make kube-scheduler retry

ANNOTATION_VERSION = 1
MAX_CONTAINERS = 256  # containers named in one pod's annotation (init and app together)


class AnnotationError(b.RefusedValue):
    """An annotation that does not parse; the message names the annotation and what is wrong."""


@dataclass(frozen=True)
class GpuShare:
    """What one container holds (or is to hold) on one GPU."""

    index: int
    uuid: str
    mem: int  # gpu-mem units
    core: int  # percent of this GPU (0 on nodes that do not serve gpu-core.percentage)
    whole: bool = False  # the GPU is held whole (gpu-count)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"index": self.index, "uuid": self.uuid, "mem": self.mem, "core": self.core}
        if self.whole:
            out["whole"] = True
        return out


@dataclass(frozen=True)
class PodAssignment:
    """The GPUs each container of a pod gets, by container name (init containers included)."""

    node: str
    time_ns: int  # Unix nanoseconds: the extender's assume time, or when the node daemon placed it
    containers: Mapping[str, tuple[GpuShare, ...]] = field(default_factory=dict)
    # The pod's UID, in the node daemon's record (ANN_ALLOCATED): the apiserver gives a pod its UID when it creates
    # it, so a record the pod was created with cannot name it, and the daemon does not take it for its own.
    uid: str = ""

    def render(self) -> str:
        doc: dict[str, object] = {
            "version": ANNOTATION_VERSION, "node": self.node, "time": self.time_ns,
            "containers": {name: [s.to_json() for s in shares] for name, shares in sorted(self.containers.items())},
        }
        if self.uid:
            doc["uid"] = self.uid
        return json.dumps(doc, separators=(",", ":"))


def parse_assignment(text: str, annotation: str = ANN_SCHEDULED) -> PodAssignment:
    """Parse ANN_SCHEDULED / ANN_ALLOCATED; AnnotationError naming what is wrong."""
    try:
        doc = b.load_json_object(text, f"annotation {annotation}")
        containers: dict[str, tuple[GpuShare, ...]] = {}
        raw = b.obj(doc.get("containers", {}), "containers")
        if len(raw) > MAX_CONTAINERS:
            raise b.RefusedValue(f"containers has {len(raw)} entries; a pod has at most {MAX_CONTAINERS}")
        for name, shares in raw.items():
            b.short_text(name, "container name")
            listed = b.seq(shares, f"container {name!r}: its GPUs", LIMITS_MAX_DEVICES)
            containers[name] = tuple(_share(s, f"container {name!r}: GPU entry {i}") for i, s in enumerate(listed))
        return PodAssignment(node=b.short_text(doc.get("node", ""), "node"),
                             time_ns=b.nat(doc.get("time", 0), "time"), containers=containers,
                             uid=b.short_text(doc.get("uid", ""), "uid"))
    except b.RefusedValue as exc:
        raise AnnotationError(_named(annotation, exc)) from None


def _share(raw: object, what: str) -> GpuShare:
    doc = b.obj(raw, what)
    if "index" not in doc:
        raise b.RefusedValue(f"{what}: no index")
    return GpuShare(index=b.nat(doc["index"], f"{what}: index", b.MAX_GPU_INDEX),
                    uuid=b.short_text(doc.get("uuid", ""), f"{what}: uuid"),
                    mem=b.nat(doc.get("mem", 0), f"{what}: mem", b.MAX_AMOUNT),
                    core=b.nat(doc.get("core", 0), f"{what}: core", CORE_PER_GPU),
                    whole=b.flag(doc.get("whole", False), f"{what}: whole"))


def _named(annotation: str, exc: Exception) -> str:
    """The refusal's message, naming the annotation once."""
    msg = str(exc)
    return msg if msg.startswith(f"annotation {annotation}") else f"annotation {annotation}: {msg}"


@dataclass(frozen=True)
class NodeGpu:
    """One GPU as the node daemon publishes it."""

    index: int
    uuid: str
    model: str
    mem_units: int  # gpu-mem units this GPU provides
    memory_mib: int
    healthy: bool = True
    nvlink_island: int | None = None  # GPUs with the same island id are joined by NVLink; None: none / not known
    numa_node: int | None = None  # None: not known
    # A MIG device (served as a GPU of its own): its GPU's UUID and NVML index, and its MIG profile ("1g.10gb").
    parent_uuid: str = ""
    parent_index: int | None = None
    mig_profile: str = ""


@dataclass(frozen=True)
class NodeInventory:
    """ANN_NODE_GPUS: what the node serves."""

    mode: str
    placement: str
    mem_unit_mib: int
    gpus: tuple[NodeGpu, ...]
    domain: str = DEFAULT_RESOURCE_DOMAIN

    def render(self) -> str:
        return json.dumps({
            "version": ANNOTATION_VERSION, "mode": self.mode, "placement": self.placement,
            "memUnitMiB": self.mem_unit_mib, "domain": self.domain,
            "gpus": [_gpu_doc(g) for g in self.gpus],
        }, separators=(",", ":"))


def _gpu_doc(g: NodeGpu) -> dict[str, object]:
    doc: dict[str, object] = {"index": g.index, "uuid": g.uuid, "model": g.model, "memUnits": g.mem_units,
                              "memMiB": g.memory_mib, "healthy": g.healthy}
    if g.nvlink_island is not None:  # optional: written only when known, so older readers see what they knew
        doc["nvlink"] = g.nvlink_island
    if g.numa_node is not None:
        doc["numa"] = g.numa_node
    if g.parent_uuid:  # a MIG device, under its GPU
        doc["parent"] = g.parent_uuid
        if g.parent_index is not None:
            doc["parentIndex"] = g.parent_index
        doc["migProfile"] = g.mig_profile
    return doc


def parse_inventory(text: str) -> NodeInventory:
    try:
        doc = b.load_json_object(text, f"annotation {ANN_NODE_GPUS}")
        if "gpus" not in doc or "mode" not in doc:
            raise b.RefusedValue("needs both mode and gpus")
        gpus = []
        for i, raw in enumerate(b.seq(doc["gpus"], "gpus", b.MAX_GPU_INDEX + 1)):
            g = b.obj(raw, f"gpus[{i}]")
            if "index" not in g or "uuid" not in g or "memUnits" not in g:
                raise b.RefusedValue(f"gpus[{i}] needs index, uuid and memUnits")
            gpus.append(NodeGpu(index=b.nat(g["index"], f"gpus[{i}].index", b.MAX_GPU_INDEX),
                                uuid=b.short_text(g["uuid"], f"gpus[{i}].uuid"),
                                model=b.short_text(g.get("model", ""), f"gpus[{i}].model"),
                                mem_units=b.nat(g["memUnits"], f"gpus[{i}].memUnits", b.MAX_AMOUNT),
                                memory_mib=b.nat(g.get("memMiB", 0), f"gpus[{i}].memMiB", b.MAX_AMOUNT),
                                healthy=b.flag(g.get("healthy", True), f"gpus[{i}].healthy"),
                                nvlink_island=_optional_nat(g, "nvlink", i),
                                numa_node=_optional_nat(g, "numa", i),
                                parent_uuid=b.short_text(g.get("parent", ""), f"gpus[{i}].parent"),
                                parent_index=_optional_nat(g, "parentIndex", i),
                                mig_profile=b.short_text(g.get("migProfile", ""), f"gpus[{i}].migProfile")))
        return NodeInventory(mode=b.short_text(doc["mode"], "mode"),
                             placement=b.short_text(doc.get("placement", "binpack"), "placement"),
                             mem_unit_mib=b.nat(doc.get("memUnitMiB", 1024), "memUnitMiB", b.MAX_AMOUNT),
                             gpus=tuple(gpus),
                             domain=b.short_text(doc.get("domain", DEFAULT_RESOURCE_DOMAIN), "domain"))
    except b.RefusedValue as exc:
        raise AnnotationError(_named(ANN_NODE_GPUS, exc)) from None


def _optional_nat(g: Mapping[str, object], key: str, i: int) -> int | None:
    value = g.get(key)
    return None if value is None else b.nat(value, f"gpus[{i}].{key}", b.MAX_GPU_INDEX)


@dataclass(frozen=True)
class GpuUsage:
    """Room in use on one GPU, as the node daemon counts it."""

    mem: int = 0  # gpu-mem units held
    core: int = 0  # percent held
    containers: int = 0
    whole: bool = False  # held whole by a gpu-count container


@dataclass(frozen=True)
class NodeUsage:
    """ANN_NODE_USAGE: per GPU index."""

    gpus: Mapping[int, GpuUsage]
    time_ns: int = 0

    def render(self) -> str:
        return json.dumps({
            "version": ANNOTATION_VERSION, "time": self.time_ns,
            "gpus": {str(i): {"mem": u.mem, "core": u.core, "containers": u.containers, "whole": u.whole}
                     for i, u in sorted(self.gpus.items())},
        }, separators=(",", ":"))


def parse_usage(text: str) -> NodeUsage:
    try:
        doc = b.load_json_object(text, f"annotation {ANN_NODE_USAGE}")
        gpus = {}
        for key, raw in b.obj(doc.get("gpus", {}), "gpus").items():
            i = b.nat_text(key, "GPU index", b.MAX_GPU_INDEX)
            u = b.obj(raw, f"gpus[{key}]")
            gpus[i] = GpuUsage(mem=b.nat(u.get("mem", 0), f"gpus[{key}].mem", b.MAX_AMOUNT),
                               core=b.nat(u.get("core", 0), f"gpus[{key}].core", b.MAX_AMOUNT),
                               containers=b.nat(u.get("containers", 0), f"gpus[{key}].containers", b.MAX_AMOUNT),
                               whole=b.flag(u.get("whole", False), f"gpus[{key}].whole"))
        return NodeUsage(gpus=gpus, time_ns=b.nat(doc.get("time", 0), "time"))
    except b.RefusedValue as exc:
        raise AnnotationError(_named(ANN_NODE_USAGE, exc)) from None


def parse_ack_allocation(text: str, annotation: str = ANN_ACK_ALLOCATION) -> dict[int, dict[int, int]]:
    """ACK's {"<app container index>": {"<GPU index>": amount}} as {container index: {GPU index: amount}}."""
    try:
        doc = b.load_json_object(text, f"annotation {annotation}")
        if len(doc) > MAX_CONTAINERS:
            raise b.RefusedValue(f"{len(doc)} containers; a pod has at most {MAX_CONTAINERS}")
        out: dict[int, dict[int, int]] = {}
        for ckey, per_gpu in doc.items():
            ci = b.nat_text(ckey, "container index", MAX_CONTAINERS)
            out[ci] = {b.nat_text(gkey, f"container {ckey}: GPU index", b.MAX_GPU_INDEX):
                       b.nat(v, f"container {ckey}: GPU {gkey}", b.MAX_AMOUNT)
                       for gkey, v in b.obj(per_gpu, f"container {ckey}").items()}
        return out
    except b.RefusedValue as exc:
        raise AnnotationError(_named(annotation, exc)) from None


def parse_assume_time(text: str, annotation: str) -> int:
    """ACK's and Alibaba's assume-time annotations: Unix nanoseconds in ASCII digits."""
    try:
        return b.nat_text(text, f"annotation {annotation}")
    except b.RefusedValue as exc:
        raise AnnotationError(str(exc)) from None


def parse_gpu_index(text: str, annotation: str = ANN_ALIYUN_MEM_IDX) -> int:
    """Alibaba's ALIYUN_COM_GPU_MEM_IDX: one GPU index in ASCII digits."""
    try:
        return b.nat_text(text, f"annotation {annotation}", b.MAX_GPU_INDEX)
    except b.RefusedValue as exc:
        raise AnnotationError(str(exc)) from None


def render_ack_allocation(alloc: Mapping[int, Mapping[int, int]]) -> str:
    return json.dumps({str(c): {str(g): v for g, v in sorted(per.items())} for c, per in sorted(alloc.items())},
                      separators=(",", ":"))


def c_header() -> str:
    """The C header the shim includes: the same names and paths as this module."""
    out = [
        "/* Generated from devplugin/contract.py by `make contract`. Do not edit. */",
        "#ifndef GPUSHARE_CONTRACT_H",
        "#define GPUSHARE_CONTRACT_H",
        "",
    ]
    for name, value in sorted(globals().items()):
        if name.startswith(("ENV_", "CONTAINER_")) and isinstance(value, str):
            out.append(f'#define GS_{name} "{value}"')
    out += [
        f"#define GS_LIMITS_VERSION {LIMITS_VERSION}",
        f"#define GS_LIMITS_MAX_DEVICES {LIMITS_MAX_DEVICES}",
        f"#define GS_USAGE_MAGIC 0x{USAGE_MAGIC:016X}ULL",
    ]
    for name, value in sorted(globals().items()):
        if name.startswith("USAGE_") and name != "USAGE_MAGIC" and isinstance(value, int):
            out.append(f"#define GS_{name} {value}")
    out += [
        "",
        "#endif /* GPUSHARE_CONTRACT_H */",
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(c_header())
