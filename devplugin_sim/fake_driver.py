"""A simulated NVIDIA driver for tests and the demo: writes the fake NVML's config and state files and drives them.

The fake `libnvidia-ml.so.1` (fakes/nvml, built by `make native` into build/fakes) reads the config named by
FAKE_NVML_CONFIG at nvmlInit and mmaps `<config>.state`, whose live fields this module changes while the
process under test runs: a GPU lost, its utilisation, its used memory; and it raises XID events that wake
nvmlEventSetWait in any process. The state file also holds each GPU's simulated timeline (kernels of every process
run there one after another, fakes/fake_gpu_timeline.h): `process_times` reads how much GPU time each process got.
fakes/README.md describes both files.

Two ways to use it:
- subprocess: `subprocess.run(..., env={**os.environ, **driver.env()})`;
- in this process: `load_in_process()` once, then `os.environ.update(driver.env())` before `pynvml.nvmlInit()`.
  pynvml dlopens "libnvidia-ml.so.1" by soname, and glibc hands back the fake already loaded under that soname.

A container's processes get a config of their own (`FakeDriver.write_container_config`): only the GPUs granted to
the container, each at the node's state slot of that GPU, the node's state file, and the node's driver socket
(devplugin_sim/driver_socket.py), which tells the fake each process's host pid.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os
import shlex
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devplugin_sim.fake_mig import FakeMig

CONFIG_ENV = "FAKE_NVML_CONFIG"
STATE_SUFFIX = ".state"
LIBRARY = "libnvidia-ml.so.1"
FAKES_DIR_ENV = "GPUSHARE_FAKES_DIR"  # where the fake libraries are, when not in the repo's build/fakes

NVML_EVENT_XID_CRITICAL_ERROR = 0x8
FAKE_EVENT_GPU_LOST = 0x8000000000000000
MAX_GPUS = 16
EVENT_RING = 64
STATE_MAGIC = 0x3154535550474B46
STATE_VERSION = 3
SAMPLES_SHARE, SAMPLES_RESIDENT = 0, 1  # fake_gpu_timeline.h FAKE_GPU_SAMPLES_*
MAX_PROCS = 64
SEGMENTS = 512
PROC_SAMPLES = 16
DEFAULT_HOST_PID_OFFSET = 100000  # NVML reports pid + this: a host's view of a pod's processes
SEED_GPU_NAME = "Tesla V100-SXM2-16GB"
_SEED_NAMESPACE = uuidlib.UUID("5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90")


@dataclass(frozen=True)
class ProcessTime:
    """GPU time one process context has had on the simulated GPU."""

    pid: int  # the process's own pid
    host_pid: int  # the pid NVML reports for it
    busy_ns: int  # kernel time run so far


@dataclass(frozen=True)
class FakeGPU:
    """One simulated GPU, as the config line describes it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int
    pci_bus_id: str
    numa_node: int | None = 0
    sms: int = 80
    compute_capability: tuple[int, int] = (7, 0)
    events_supported: bool = True  # False: nvmlDeviceRegisterEvents answers NOT_SUPPORTED for this GPU
    nvlink_island: int | None = None  # NVLink-connected to every GPU of the same island; None: no NVLink
    mig: bool | None = None  # MIG mode now (None: the GPU cannot run MIG); mig_devices only when True
    mig_pending: bool | None = None  # the mode after the next GPU reset (None: the same as mig)
    mig_devices: tuple[FakeMig, ...] = ()

    def config_line(self, slot: int | None = None) -> str:
        """The config's gpu line; slot: the GPU's entry in the node's state file, for a container's config."""
        if '"' in self.name:
            raise ValueError(f"GPU name {self.name!r} cannot contain a double quote")
        fields = [
            f"uuid={self.uuid}",
            f'name="{self.name}"',
            f"memory_mib={self.memory_mib}",
            f"minor={self.minor}",
            f"pci={self.pci_bus_id}",
            f"numa={-1 if self.numa_node is None else self.numa_node}",
            f"sms={self.sms}",
            f"cc={self.compute_capability[0]}.{self.compute_capability[1]}",
        ]
        if not self.events_supported:
            fields.append("events=0")
        if self.nvlink_island is not None:
            fields.append(f"nvlink={self.nvlink_island}")
        if self.mig is not None:
            fields.append(f"mig={int(self.mig)}")
            if self.mig_pending is not None and self.mig_pending != self.mig:
                fields.append(f"mig_pending={int(self.mig_pending)}")
        if slot is not None:
            fields.append(f"slot={slot}")
        return "gpu " + " ".join(fields)


def mig_slots(gpus: Sequence[FakeGPU]) -> dict[str, int]:
    """Each MIG device's state slot: after the GPUs', in order. ValueError for a layout the fake cannot hold."""
    slots: dict[str, int] = {}
    for gpu in gpus:
        if gpu.mig_devices and gpu.mig is not True:
            raise ValueError(f"GPU {gpu.uuid} lists MIG devices but its MIG mode is not enabled (mig=True)")
        for m in gpu.mig_devices:
            slots[m.uuid] = len(gpus) + len(slots)
    if len(gpus) + len(slots) > MAX_GPUS:
        raise ValueError(f"the fake driver holds at most {MAX_GPUS} GPUs and MIG devices together, not "
                         f"{len(gpus)} + {len(slots)}")
    return slots


def seed_uuid(index: int, node: str = "seed") -> str:
    """A stable GPU UUID in NVIDIA's format (GPU-xxxxxxxx-xxxx-...), the same on every run."""
    return f"GPU-{uuidlib.uuid5(_SEED_NAMESPACE, f'{node}/{index}')}"


def seed_node(n: int = 4, memory_mib: int = 15360, name: str = SEED_GPU_NAME) -> list[FakeGPU]:
    """The seed's node: n GPUs of memory_mib each (4 x 15 GiB V100s by default), deterministic UUIDs."""
    return [
        FakeGPU(
            index=i,
            uuid=seed_uuid(i),
            name=name,
            memory_mib=memory_mib,
            minor=i,
            pci_bus_id=f"00000000:00:{0x07 + i:02X}.0",
            numa_node=0,
            sms=80,
            compute_capability=(7, 0),
        )
        for i in range(n)
    ]


def nvlink_node(islands: int = 2, per_island: int = 4, memory_mib: int = 81920,
                name: str = "NVIDIA A100-SXM4-80GB", node: str = "seed") -> list[FakeGPU]:
    """A node of `islands` NVLink islands of `per_island` GPUs each (8 GPUs in two islands of 4 by default):
    island i is GPUs i*per_island.. and sits on NUMA node i."""
    return [
        FakeGPU(index=i, uuid=seed_uuid(i, node), name=name, memory_mib=memory_mib, minor=i,
                pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=i // per_island, sms=108,
                compute_capability=(8, 0), nvlink_island=i // per_island)
        for i in range(islands * per_island)
    ]


def library_dir() -> Path:
    """The folder holding the fake libnvidia-ml.so.1 (and libcuda.so.1); FileNotFoundError if not built."""
    override = os.environ.get(FAKES_DIR_ENV)
    folder = Path(override) if override else Path(__file__).resolve().parents[1] / "build" / "fakes"
    if not (folder / LIBRARY).is_file():
        raise FileNotFoundError(
            f"the fake NVIDIA driver is not built: {folder / LIBRARY} is missing; run `make native` "
            f"in the repository root (or set {FAKES_DIR_ENV} to where it was built)"
        )
    return folder


_loaded: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    """The fake, loaded once by absolute path with RTLD_GLOBAL, with the fake's own entry points typed."""
    global _loaded
    if _loaded is None:
        lib = ctypes.CDLL(str(library_dir() / LIBRARY), mode=ctypes.RTLD_GLOBAL)
        lib.fakeNvml_initState.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_char_p, ctypes.c_uint]
        lib.fakeNvml_initState.restype = ctypes.c_int
        lib.fakeNvml_postEvent.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_ulonglong]
        lib.fakeNvml_postEvent.restype = ctypes.c_int
        lib.fakeNvml_refcount.restype = ctypes.c_int
        lib.fakeNvml_stateLayout.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int]
        lib.fakeNvml_stateLayout.restype = ctypes.c_int
        lib.fakeNvml_processTimes.argtypes = [
            ctypes.c_char_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int,
        ]
        lib.fakeNvml_processTimes.restype = ctypes.c_int
        lib.fakeNvml_utilization.argtypes = [ctypes.c_char_p, ctypes.c_uint]
        lib.fakeNvml_utilization.restype = ctypes.c_int
        _loaded = lib
    return _loaded


def load_in_process() -> ctypes.CDLL:
    """Load the fake into this process so that pynvml's dlopen("libnvidia-ml.so.1") gets it.

    Call before the first pynvml.nvmlInit(). Raises RuntimeError when another libnvidia-ml.so.1 (a real
    driver's) is already loaded here: tests must never talk to a real GPU by accident.
    """
    lib = _library()
    by_soname = ctypes.CDLL(LIBRARY)
    if not hasattr(by_soname, "fakeNvml_refcount"):
        raise RuntimeError(
            "a real libnvidia-ml.so.1 was loaded into this process before the fake; "
            "call load_in_process() before anything imports and initialises NVML"
        )
    return lib


def nvml_refcount() -> int:
    """nvmlInit calls the fake has seen that no nvmlShutdown has matched yet (0 when code pairs them)."""
    return int(_library().fakeNvml_refcount())


class _Slot(ctypes.Structure):
    _fields_ = [
        ("lost", ctypes.c_uint32),
        ("util_percent", ctypes.c_uint32),
        ("mem_used_bytes", ctypes.c_uint64),
        ("mem_util_percent", ctypes.c_uint32),
        ("reserved32", ctypes.c_uint32 * 3),
        ("reserved64", ctypes.c_uint64 * 4),
    ]


class _Event(ctypes.Structure):
    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("gpu_index", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("event_type", ctypes.c_uint64),
        ("event_data", ctypes.c_uint64),
    ]


class _Segment(ctypes.Structure):
    _fields_ = [("proc", ctypes.c_uint32), ("pid", ctypes.c_int32), ("start", ctypes.c_uint64),
                ("end", ctypes.c_uint64)]


class _Sample(ctypes.Structure):
    _fields_ = [("ts_us", ctypes.c_uint64), ("sm_util", ctypes.c_uint32), ("span_us", ctypes.c_uint32)]


class _Proc(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int32),
        ("host_pid", ctypes.c_uint32),
        ("gpu", ctypes.c_uint32),
        ("nsamples", ctypes.c_uint32),
        ("queued_ns", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
        ("sampled_busy_ns", ctypes.c_uint64),
        ("mem_used_bytes", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
        ("samples", _Sample * PROC_SAMPLES),
    ]


class _Timeline(ctypes.Structure):
    _fields_ = [
        ("lock", ctypes.c_uint32),
        ("nseg", ctypes.c_uint32),
        ("head", ctypes.c_uint32),
        ("util_percent", ctypes.c_uint32),
        ("busy_until", ctypes.c_uint64),
        ("settled_at", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
        ("last_sample_ns", ctypes.c_uint64),
        ("sampled_busy_ns", ctypes.c_uint64),
        ("last_work_ns", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
        ("seg", _Segment * SEGMENTS),
    ]


class _State(ctypes.Structure):
    """Mirror of struct fake_gpu_state (fakes/fake_gpu_state.h); checked against the C layout at load."""

    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("version", ctypes.c_uint32),
        ("gpu_count", ctypes.c_uint32),
        ("event_seq", ctypes.c_uint32),
        ("reserved0", ctypes.c_uint32),
        ("instance", ctypes.c_uint64),
        ("host_pid_offset", ctypes.c_uint32),
        ("sample_period_ms", ctypes.c_uint32),
        ("proc_lock", ctypes.c_uint32),
        ("sample_mode", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32 * 4),
        ("gpus", _Slot * MAX_GPUS),
        ("events", _Event * EVENT_RING),
        ("timeline", _Timeline * MAX_GPUS),
        ("procs", _Proc * MAX_PROCS),
    ]


STATE_SIZE = ctypes.sizeof(_State)


def python_state_layout() -> list[int]:
    """The ctypes mirror's layout, in the order fakeNvml_stateLayout() reports the C one."""
    return [
        ctypes.sizeof(_State),
        _State.event_seq.offset,
        _State.instance.offset,
        _State.gpus.offset,
        ctypes.sizeof(_Slot),
        _Slot.lost.offset,
        _Slot.util_percent.offset,
        _Slot.mem_used_bytes.offset,
        _Slot.mem_util_percent.offset,
        _State.events.offset,
        ctypes.sizeof(_Event),
        MAX_GPUS,
        EVENT_RING,
        STATE_MAGIC,
        STATE_VERSION,
        _State.host_pid_offset.offset,
        _State.sample_period_ms.offset,
        _State.timeline.offset,
        ctypes.sizeof(_Timeline),
        _State.procs.offset,
        ctypes.sizeof(_Proc),
        _Proc.host_pid.offset,
        _Proc.busy_ns.offset,
        _State.sample_mode.offset,
    ]


def c_state_layout() -> list[int]:
    out = (ctypes.c_ulonglong * 32)()
    n = _library().fakeNvml_stateLayout(out, len(out))
    return list(out[:n])


class FakeDriver:
    """The config and state files of one simulated node, and the knobs tests turn while a process runs."""

    def __init__(
        self,
        config_path: Path,
        gpus: list[FakeGPU],
        *,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        state_path: Path | None = None,
    ) -> None:
        self.config_path = Path(config_path)
        self.state_path = Path(state_path) if state_path else Path(str(config_path) + STATE_SUFFIX)
        self.gpus = list(gpus)
        self.mig_slots = mig_slots(self.gpus)
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self._mm: mmap.mmap | None = None
        self._state: _State | None = None

    @classmethod
    def create(
        cls,
        directory: Path,
        gpus: list[FakeGPU],
        *,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        name: str = "nvml.conf",
        host_pid_offset: int = DEFAULT_HOST_PID_OFFSET,
        sample_period_ms: int = 50,
        resident_samples: bool = False,
    ) -> FakeDriver:
        """Write `<directory>/<name>` and a fresh state file next to it; return the driver.

        host_pid_offset: NVML reports each process as pid + this (0: its own pid), as a host sees a pod's
        processes. sample_period_ms: how often the simulated GPU takes utilisation samples. resident_samples:
        each per-process sample names the one process resident on the GPU with the whole GPU's use (as an H100
        with driver 580 reports them), rather than every process with its own share.
        """
        if not 0 <= host_pid_offset < 1 << 31:
            raise ValueError(f"host_pid_offset must be 0..2^31-1, not {host_pid_offset}")
        if not 1 <= sample_period_ms <= 10000:
            raise ValueError(f"sample_period_ms must be 1..10000, not {sample_period_ms}")
        if len(gpus) > MAX_GPUS:
            raise ValueError(f"the fake driver simulates at most {MAX_GPUS} GPUs, not {len(gpus)}")
        for i, gpu in enumerate(gpus):
            if gpu.index != i:
                raise ValueError(f"GPU {gpu.uuid} has index {gpu.index} but is number {i} in the list")
        slots = mig_slots(gpus)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / name
        lines = [
            "# fake NVIDIA driver for libnvidia-ml.so.1 (fakes/nvml); format: fakes/README.md",
            f"driver_version={driver_version}",
            f"cuda_version={cuda_version}",
            *(gpu.config_line() for gpu in gpus),
            *(m.config_line(gpu.uuid, slots[m.uuid]) for gpu in gpus for m in gpu.mig_devices),
        ]
        config.write_text("\n".join(lines) + "\n")
        driver = cls(config, gpus, driver_version=driver_version, cuda_version=cuda_version)
        driver.state_path.unlink(missing_ok=True)
        driver._open_state()
        assert driver._state is not None
        driver._state.host_pid_offset = host_pid_offset
        driver._state.sample_period_ms = sample_period_ms
        driver._state.sample_mode = SAMPLES_RESIDENT if resident_samples else SAMPLES_SHARE
        return driver

    @classmethod
    def attach(cls, config_path: Path) -> FakeDriver:
        """The driver of an existing config (another process created it), to turn its knobs from here."""
        gpus: list[FakeGPU] = []
        migs: list[dict[str, str]] = []
        settings: dict[str, str] = {}
        for line in Path(config_path).read_text().splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] != "gpu" and "=" in words[0]:
                key, value = words[0].split("=", 1)
                settings[key] = value
            if words and words[0] == "mig":
                migs.append(dict(w.split("=", 1) for w in words[1:]))
            if not words or words[0] != "gpu":
                continue
            kv = dict(w.split("=", 1) for w in words[1:])
            cc = kv.get("cc", "7.0").split(".")
            numa = int(kv.get("numa", "-1"))
            gpus.append(FakeGPU(
                index=len(gpus), uuid=kv["uuid"], name=kv["name"], memory_mib=int(kv["memory_mib"]),
                minor=int(kv.get("minor", len(gpus))), pci_bus_id=kv.get("pci", ""),
                numa_node=None if numa < 0 else numa, sms=int(kv.get("sms", "80")),
                compute_capability=(int(cc[0]), int(cc[1])), events_supported=kv.get("events", "1") == "1",
                mig=None if "mig" not in kv else kv["mig"] == "1",
                mig_pending=None if "mig_pending" not in kv else kv["mig_pending"] == "1",
            ))
        for m in migs:
            parent = next(i for i, g in enumerate(gpus) if g.uuid == m["parent"])
            mig = FakeMig(uuid=m["uuid"], profile=m["profile"], memory_mib=int(m["memory_mib"]), sms=int(m["sms"]),
                          gi=int(m.get("gi", "0")), ci=int(m.get("ci", "0")))
            gpus[parent] = dataclasses.replace(gpus[parent], mig_devices=(*gpus[parent].mig_devices, mig))
        driver = cls(
            Path(config_path), gpus, driver_version=settings.get("driver_version", "550.54.15"),
            cuda_version=int(settings.get("cuda_version", "12040")),
            state_path=Path(settings["state"]) if "state" in settings else None,
        )
        driver._open_state()
        return driver

    def rewrite(self, gpus: list[FakeGPU]) -> None:
        """Replace the config with these GPUs (the same GPUs, MIG modes and MIG devices changed, as an operator
        changes them on a running node): the fake NVML reads their MIG layout again at its next MIG call, without
        nvmlInit. The state file is kept; the new MIG devices take the slots after the GPUs again."""
        if [g.uuid for g in gpus] != [g.uuid for g in self.gpus]:
            raise ValueError("rewrite changes MIG layouts only: give the same GPUs in the same order")
        slots = mig_slots(gpus)
        text = self.config_path.read_text().splitlines()
        kept = [line for line in text if not line.startswith(("gpu ", "mig "))]
        kept += [g.config_line() for g in gpus]
        kept += [m.config_line(g.uuid, slots[m.uuid]) for g in gpus for m in g.mig_devices]
        tmp = self.config_path.with_name(self.config_path.name + ".new")
        tmp.write_text("\n".join(kept) + "\n")
        tmp.replace(self.config_path)
        self.gpus, self.mig_slots = list(gpus), slots

    def write_container_config(
        self,
        path: Path,
        granted: Sequence[str],
        *,
        driver_socket: str | Path | None,
        state_path: str | Path | None = None,
    ) -> Path:
        """Write the config a container's processes read (what the node's container runtime writes).

        granted: UUIDs of the GPUs the container gets, in the order it sees them (its NVML and CUDA index 0, 1,
        ...); each keeps the node's state slot (`slot=` its node index), so memory, timeline and processes are
        the node's. driver_socket: the node's driver socket as the container sees it (None: the container's
        processes are identified by their own getpid()). state_path: the node's state file as the container sees
        it (default: where it is on the node).
        """
        by_uuid = {gpu.uuid: gpu for gpu in self.gpus}
        parent_of = {m.uuid: gpu for gpu in self.gpus for m in gpu.mig_devices}
        unknown = [u for u in granted if u not in by_uuid and u not in parent_of]
        if unknown:
            raise ValueError(f"GPU(s) {', '.join(unknown)} are not on this node ({self.config_path}); it has "
                             f"{', '.join(by_uuid)}")
        if len(set(granted)) != len(granted):
            raise ValueError(f"a GPU is granted twice: {', '.join(granted)}")
        state = Path(state_path) if state_path is not None else self.state_path.resolve()
        if not state.is_absolute():
            raise ValueError(f"state_path must be absolute, not {state}")
        lines = [
            f"# a container's view of the fake node {self.config_path}; format: fakes/README.md",
            f"driver_version={self.driver_version}",
            f"cuda_version={self.cuda_version}",
            f"state={state}",
        ]
        if driver_socket is not None:
            if not Path(driver_socket).is_absolute() or len(str(driver_socket)) > 107:
                raise ValueError(f"driver_socket must be an absolute path of at most 107 characters, not "
                                 f"{driver_socket}")
            lines.append(f"driver_socket={driver_socket}")
        for u in granted:  # a MIG device: its GPU's line (once), then the MIG device's
            gpu = by_uuid.get(u) or parent_of[u]
            line = gpu.config_line(slot=gpu.index)
            if line not in lines:
                lines.append(line)
            if u in parent_of:
                lines.append(next(m for m in gpu.mig_devices if m.uuid == u).config_line(gpu.uuid, self.mig_slots[u]))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path

    def _open_state(self) -> None:
        """Create the state file if missing (else check it), then map it."""
        if python_state_layout() != c_state_layout():
            raise RuntimeError(
                "devplugin_sim/fake_driver.py and fakes/fake_gpu_state.h disagree on the state file layout "
                f"(python {python_state_layout()} vs C {c_state_layout()}); rebuild with `make native`"
            )
        err = ctypes.create_string_buffer(1024)
        if _library().fakeNvml_initState(str(self.state_path).encode(), len(self.gpus), err, len(err)) != 0:
            raise RuntimeError(f"cannot set up the fake GPU state: {err.value.decode(errors='replace')}")
        with open(self.state_path, "r+b") as f:
            self._mm = mmap.mmap(f.fileno(), ctypes.sizeof(_State))
        self._state = _State.from_buffer(self._mm)

    def env(self) -> dict[str, str]:
        """Env for a process that should see this node: the config and the fake libraries on its path."""
        path = str(library_dir())
        inherited = os.environ.get("LD_LIBRARY_PATH")
        return {
            CONFIG_ENV: str(self.config_path),
            "LD_LIBRARY_PATH": f"{path}:{inherited}" if inherited else path,
        }

    def mig_slot(self, mig_uuid: str) -> int:
        """The state slot of a MIG device: what the methods below take as `gpu_index` for it."""
        if mig_uuid not in self.mig_slots:
            raise KeyError(f"MIG device {mig_uuid} is not on this node ({self.config_path})")
        return self.mig_slots[mig_uuid]

    def _slot(self, gpu_index: int) -> _Slot:
        last = len(self.gpus) + len(self.mig_slots) - 1
        if not 0 <= gpu_index <= last:
            raise IndexError(f"GPU index {gpu_index} is not on this node (0..{last}, MIG devices after the GPUs)")
        if self._state is None:
            raise RuntimeError("this FakeDriver is closed")
        return self._state.gpus[gpu_index]

    def _post(self, gpu_index: int, event_type: int, data: int) -> None:
        self._slot(gpu_index)
        rc = _library().fakeNvml_postEvent(str(self.state_path).encode(), gpu_index, event_type, data)
        if rc != 0:
            raise OSError(-rc, f"cannot post a fake GPU event to {self.state_path}: {os.strerror(-rc)}")

    def raise_xid(self, gpu_index: int, xid: int) -> None:
        """An XID critical error on that GPU: every event set registered for it wakes with eventData = xid."""
        self._post(gpu_index, NVML_EVENT_XID_CRITICAL_ERROR, xid)

    def raise_event(self, gpu_index: int, event_type: int, data: int = 0) -> None:
        """Any NVML event type (nvmlEventType* bits)."""
        self._post(gpu_index, event_type, data)

    def set_lost(self, gpu_index: int, lost: bool) -> None:
        """Lose the GPU (NVML answers GPU_IS_LOST for it; waiters registered for it wake) or bring it back."""
        self._slot(gpu_index).lost = 1 if lost else 0
        if lost:
            self._post(gpu_index, FAKE_EVENT_GPU_LOST, 0)

    def set_utilization(self, gpu_index: int, percent: int, memory_percent: int | None = None) -> None:
        if not 0 <= percent <= 100 or (memory_percent is not None and not 0 <= memory_percent <= 100):
            raise ValueError("utilisation is a percentage, 0..100")
        slot = self._slot(gpu_index)
        slot.util_percent = percent
        if memory_percent is not None:
            slot.mem_util_percent = memory_percent

    def set_memory_used(self, gpu_index: int, used_bytes: int) -> None:
        if used_bytes < 0:
            raise ValueError("used memory cannot be negative")
        self._slot(gpu_index).mem_used_bytes = used_bytes

    def set_timeline_lock(self, gpu_index: int, holder: int) -> None:
        """As if process `holder` (its identity: host pid) held the GPU's timeline lock; 0 releases it. A process
        that needs the lock waits while the holder is alive and takes it over once it is not."""
        self._slot(gpu_index)
        if not 0 <= holder < 1 << 31:
            raise ValueError(f"a lock holder is a pid 0..2^31-1, not {holder}")
        assert self._state is not None
        self._state.timeline[gpu_index].lock = holder

    def utilization(self, gpu_index: int) -> int:
        """What nvmlDeviceGetUtilizationRates reports now: the simulated timeline's last sample while kernels
        run there (within the last 2 s), else what set_utilization wrote."""
        self._slot(gpu_index)
        util = _library().fakeNvml_utilization(str(self.state_path).encode(), gpu_index)
        if util < 0:
            raise OSError(-util, f"cannot read the fake GPU state {self.state_path}: {os.strerror(-util)}")
        return int(util)

    def memory_used(self, gpu_index: int) -> int:
        """Used bytes as the state says (written by tests or by the fake libcuda's allocations)."""
        return int(self._slot(gpu_index).mem_used_bytes)

    def is_lost(self, gpu_index: int) -> bool:
        return bool(self._slot(gpu_index).lost)

    @property
    def host_pid_offset(self) -> int:
        """NVML reports a process as its pid + this."""
        if self._state is None:
            raise RuntimeError("this FakeDriver is closed")
        return int(self._state.host_pid_offset)

    def process_times(self, gpu_index: int) -> list[ProcessTime]:
        """Kernel time each process context on the GPU has run so far (contexts of ended processes drop out)."""
        self._slot(gpu_index)
        n = MAX_PROCS
        pids, hosts, busy = (ctypes.c_uint * n)(), (ctypes.c_uint * n)(), (ctypes.c_ulonglong * n)()
        count = _library().fakeNvml_processTimes(str(self.state_path).encode(), gpu_index, pids, hosts, busy, n)
        if count < 0:
            raise OSError(-count, f"cannot read the fake GPU timeline in {self.state_path}: {os.strerror(-count)}")
        return [ProcessTime(int(pids[i]), int(hosts[i]), int(busy[i])) for i in range(min(count, n))]

    def close(self) -> None:
        self._state = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def __enter__(self) -> FakeDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
