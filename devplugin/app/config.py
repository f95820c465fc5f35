"""`devplugin serve` settings: one typed dataclass; every flag is also settable by an env var."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from devplugin.allocation.node import MODES, PLACEMENTS
from devplugin.allocation.units import MemUnit, parse_mem_unit
from devplugin.deviceplugin.device_list import STRATEGIES
from devplugin.deviceplugin.toolkit_config import AUTO as AUTO_STRATEGY
from devplugin.deviceplugin.toolkit_config import DEFAULT_PATH as TOOLKIT_CONFIG
from devplugin.gpu.health import DEFAULT_IGNORED_XIDS, DEFAULT_RESET_XIDS

ENV_PREFIX = "DEVPLUGIN_"
METRICS_AUTH = ("none", "kubernetes")
_T = TypeVar("_T")


def _opt(default: _T, help: str, env: str | None = None, choices: tuple[str, ...] | None = None,
         maximum: float | None = None) -> _T:
    """A setting. Every float setting must be finite and > 0; `maximum` bounds it where more is meaningless."""
    return field(default=default, metadata={"help": help, "env": env, "choices": choices, "maximum": maximum})


class Settings:
    """What every daemon's settings share: env names, XID lists and the checks of choices, floats and XIDs."""

    env_prefix = ENV_PREFIX
    # every component's settings have these (fields of the dataclasses below)
    health_port: int
    metrics_port: int
    metrics_address: str

    def env_name(self, name: str) -> str:
        meta = next(f for f in fields(self) if f.name == name).metadata  # type: ignore[arg-type]
        return meta.get("env") or self.env_prefix + name.upper()

    def xid_set(self, name: str) -> frozenset[int]:
        value = getattr(self, name)
        try:
            return frozenset(int(x) for x in value.replace(" ", "").split(",") if x)
        except ValueError:
            raise ValueError(f"--{name.replace('_', '-')} {value!r} is not a comma-separated list of integers "
                             f"(set by flag or {self.env_name(name)})") from None

    def check_common(self) -> None:
        """ValueError for a value outside its choices (env values skip argparse's check), a float that is not
        finite and > 0 (or above its maximum), and an XID in both --ignored-xids and --reset-xids."""
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            choices = f.metadata.get("choices")
            if choices and value not in choices:
                raise ValueError(f"--{f.name.replace('_', '-')} {value!r} is not one of "
                                 f"{', '.join(repr(c) for c in choices)} (set by flag or {self.env_name(f.name)})")
            if f.type not in ("float", float):
                continue
            maximum = f.metadata.get("maximum")
            bound = f" and at most {maximum:g}" if maximum is not None else ""
            if not (math.isfinite(value) and value > 0 and (maximum is None or value <= maximum)):
                raise ValueError(f"--{f.name.replace('_', '-')} {value!r} must be a finite number greater than 0"
                                 f"{bound} (set by flag or {self.env_name(f.name)})")
        both = self.xid_set("ignored_xids") & self.xid_set("reset_xids")
        if both:
            raise ValueError(f"XID {','.join(map(str, sorted(both)))} is in both --ignored-xids and --reset-xids "
                             f"({self.env_name('ignored_xids')}, {self.env_name('reset_xids')}): remove it from one")
        self.check_ports()

    def check_ports(self) -> None:
        """ValueError for a port outside 0..65535, one port for both the probes and /metrics, or no address."""
        for name, port in (("health_port", self.health_port), ("metrics_port", self.metrics_port)):
            if not 0 <= port <= 65535:
                raise ValueError(f"--{name.replace('_', '-')} {port} is not a port (0..65535; 0: none)")
        health, metrics = self.health_port, self.metrics_port
        if health and health == metrics:
            raise ValueError(f"--metrics-port {metrics} is --health-port's too: give each its own port (the probes' "
                             "port is open to every address, /metrics only to --metrics-address)")
        if not self.metrics_address:
            raise ValueError(f"--metrics-address is empty: name an address to listen on (127.0.0.1, or 0.0.0.0 "
                             f"with --metrics-auth kubernetes; set by flag or {self.env_name('metrics_address')})")


@dataclass
class Config(Settings):
    node_name: str = _opt("", "this node's name, to read its labels from the apiserver", env="NODE_NAME")
    mode: str = _opt(
        "", "node mode used when the label ack.node.gpu.schedule cannot be read: core_mem (gpu-mem, "
        "gpu-core.percentage, gpu-count), cgpu or share (gpu-mem, gpu-count)", choices=("",) + MODES)
    placement: str = _opt(
        "binpack", "GPU choice used when the label ack.node.gpu.placement is absent: binpack fills one GPU "
        "first, spread takes the emptiest", choices=PLACEMENTS)
    mem_unit: str = _opt("GiB", "size of one gpu-mem device: GiB, 512MiB, 256MiB or 128MiB")
    resource_domain: str = _opt("aliyun.com", "domain of the resource names (<domain>/gpu-mem ...)")
    plugin_dir: str = _opt("/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory")
    pod_resources_socket: str = _opt(
        "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's PodResources socket, read at start to "
        "learn which devices are already held")
    kubeconfig: str = _opt("", "kubeconfig for the apiserver (empty: in-cluster config, then ~/.kube/config)")
    apiserver_timeout: float = _opt(5.0, "seconds to wait for the apiserver before falling back to --mode",
                                    maximum=300.0)
    ignored_xids: str = _opt(
        ",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS)),
        "comma-separated XIDs that do not mark a GPU unhealthy (NVIDIA's default list)")
    reset_xids: str = _opt(
        ",".join(str(x) for x in sorted(DEFAULT_RESET_XIDS)),
        "comma-separated XIDs after which a GPU stays unhealthy until it is reset: a reboot, or `touch "
        "<state-dir>/reset-done/<GPU UUID>` after `nvidia-smi -r` (ECC, row remapping, NVLink, fallen off the bus)")
    recovery_seconds: float = _opt(
        60.0, "an unhealthy GPU that has raised no critical XID for this long and answers NVML turns healthy "
        "(XIDs in --reset-xids excepted)", maximum=86400.0)
    state_dir: str = _opt(
        "/var/lib/gpushare", "host directory for state that outlives the daemon: unhealthy GPUs "
        "(gpu-health.json) and reset markers (reset-done/<GPU UUID>)")
    mig_check_interval: float = _opt(
        10.0, "seconds between reads of each GPU's MIG mode and MIG devices: a GPU whose MIG mode waits for a reset "
        "or whose MIG devices changed takes no new pods until it is drained", maximum=3600.0)
    pair_window: float = _opt(
        1.0, "seconds within which a container's gpu-mem and gpu-core.percentage calls are paired", maximum=60.0)
    lookup_budget: float = _opt(
        0.3, "seconds an admission may wait for the apiserver to name the pod (when the pod cache has not seen it "
        "yet); past that the container is placed by node-local pairing and named later", maximum=5.0)
    lookup_patience: float = _opt(
        5.0, "seconds an admission waits once more for an apiserver that did not answer within --lookup-budget "
        "(a slow one: an apiserver that refuses answers at once) before placing by node-local pairing, which cannot "
        "follow the scheduler's GPU choice", maximum=60.0)
    health_port: int = _opt(
        8089, "port of /healthz and /readyz, the DaemonSet's probes, on every address (0: none); ready once the "
        "node's held devices are known and every resource is registered")
    metrics_port: int = _opt(
        0, "port of /metrics (Prometheus; 0: none): the per-GPU figures and each container's GPU use, which "
        "name every tenant's namespaces, pods and containers (the DaemonSet serves it on 8091)")
    metrics_address: str = _opt(
        "127.0.0.1", "address /metrics listens on: loopback by default; 0.0.0.0 (every address) for a scraper "
        "outside the pod, with --metrics-auth kubernetes")
    metrics_auth: str = _opt(
        "none", "who may read /metrics: none (whoever reaches --metrics-address) or kubernetes (a bearer token "
        "the apiserver authenticates and allows get on /metrics: TokenReview and SubjectAccessReview)",
        choices=METRICS_AUTH)
    device_list_strategy: str = _opt(
        "auto", "how a container is told its GPUs: auto (volume-mounts where the node's container toolkit accepts "
        "volume mounts, read from --toolkit-config; envvar otherwise), envvar (NVIDIA_VISIBLE_DEVICES=<UUIDs>), "
        "volume-mounts (a mount per GPU under /var/run/nvidia-container-devices; a pod's own env then grants "
        "nothing) or cdi-cri (CDI device names nvidia.com/gpu=<UUID>); see docs/reference/security.md for the "
        "container toolkit's settings", choices=(AUTO_STRATEGY, *STRATEGIES))
    toolkit_config: str = _opt(
        TOOLKIT_CONFIG, "the node's NVIDIA container toolkit config (mounted read-only): what it accepts as a GPU "
        "grant decides --device-list-strategy auto")
    shim: str = _opt("auto", "mount the isolation shim into shared containers: auto (when --shim-lib exists), "
                     "on, off", choices=("auto", "on", "off"))
    shim_lib: str = _opt("/usr/local/gpushare/lib/libgpushare.so", "host path of the shim library")
    shim_state_dir: str = _opt("/var/run/gpushare", "host directory for per-container limits and accounting")
    log_format: str = _opt("text", "log format", choices=("text", "json"))
    log_level: str = _opt("INFO", "log level", choices=("DEBUG", "INFO", "WARNING", "ERROR"))

    def unit(self) -> MemUnit:
        return parse_mem_unit(self.mem_unit)

    def ignored_xid_set(self) -> frozenset[int]:
        return self.xid_set("ignored_xids")

    def reset_xid_set(self) -> frozenset[int]:
        return self.xid_set("reset_xids")

    def validate(self) -> None:
        """Raise ValueError naming the setting that is wrong and how to fix it (env values skip argparse's
        choices check, so choices are checked here too)."""
        self.check_common()
        self.unit()
        if not self.resource_domain or "/" in self.resource_domain:
            raise ValueError(f"--resource-domain {self.resource_domain!r} must be a DNS domain like aliyun.com")
        if not self.state_dir:
            raise ValueError(f"--state-dir must name a directory (set by flag or {self.env_name('state_dir')})")


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any] | None = None) -> None:
    """One flag per field of `cls` (Config unless given; any dataclass with defaults and env_name()); defaults
    come from the env var when set."""
    cls = cls or Config
    probe = cls()
    for f in fields(cls):
        env = probe.env_name(f.name)
        default = os.environ.get(env, f.default if f.default is not MISSING else None)
        kind: type[Any] = type(f.default)
        choices = f.metadata.get("choices")
        try:
            default = kind(default)
        except ValueError:
            parser.error(f"env {env}={default!r} is not a {kind.__name__}")
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=default, choices=choices,
            help=f"{f.metadata['help']} (env {env}; default {f.default!r})",
        )


def from_args(ns: argparse.Namespace) -> Config:
    cfg = Config(**{f.name: getattr(ns, f.name) for f in fields(Config)})
    cfg.validate()
    return cfg
