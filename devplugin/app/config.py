"""`devplugin serve` settings: one typed dataclass; every flag is also settable by an env var."""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields

from devplugin.allocation.node import MODES, PLACEMENTS
from devplugin.allocation.units import MemUnit, parse_mem_unit
from devplugin.gpu.health import DEFAULT_IGNORED_XIDS

ENV_PREFIX = "DEVPLUGIN_"


def _opt(default: object, help: str, env: str | None = None, choices: tuple[str, ...] | None = None) -> object:
    return field(default=default, metadata={"help": help, "env": env, "choices": choices})


@dataclass
class Config:
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
    apiserver_timeout: float = _opt(5.0, "seconds to wait for the apiserver before falling back to --mode")
    ignored_xids: str = _opt(
        ",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS)),
        "comma-separated XIDs that do not mark a GPU unhealthy (NVIDIA's default list)")
    recovery_seconds: float = _opt(
        60.0, "an unhealthy GPU that has raised no critical XID for this long and answers NVML turns healthy")
    pair_window: float = _opt(
        1.0, "seconds within which a container's gpu-mem and gpu-core.percentage calls are paired")
    shim: str = _opt("auto", "mount the isolation shim into shared containers: auto (when --shim-lib exists), "
                     "on, off", choices=("auto", "on", "off"))
    shim_lib: str = _opt("/usr/local/gpushare/lib/libgpushare.so", "host path of the shim library")
    shim_state_dir: str = _opt("/var/run/gpushare", "host directory for per-container limits and accounting")
    log_format: str = _opt("text", "log format", choices=("text", "json"))
    log_level: str = _opt("INFO", "log level", choices=("DEBUG", "INFO", "WARNING", "ERROR"))

    def env_name(self, name: str) -> str:
        meta = next(f for f in fields(self) if f.name == name).metadata
        return meta.get("env") or ENV_PREFIX + name.upper()

    def unit(self) -> MemUnit:
        return parse_mem_unit(self.mem_unit)

    def ignored_xid_set(self) -> frozenset[int]:
        try:
            return frozenset(int(x) for x in self.ignored_xids.replace(" ", "").split(",") if x)
        except ValueError:
            raise ValueError(
                f"--ignored-xids {self.ignored_xids!r} is not a comma-separated list of integers"
            ) from None

    def validate(self) -> None:
        """Raise ValueError naming the setting that is wrong and how to fix it (env values skip argparse's
        choices check, so choices are checked here too)."""
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"--{f.name.replace('_', '-')} {getattr(self, f.name)!r} is not one of "
                                 f"{', '.join(repr(c) for c in choices)} (set by flag or {self.env_name(f.name)})")
        self.unit()
        self.ignored_xid_set()
        if not self.resource_domain or "/" in self.resource_domain:
            raise ValueError(f"--resource-domain {self.resource_domain!r} must be a DNS domain like aliyun.com")
        for name in ("recovery_seconds", "pair_window", "apiserver_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per Config field; defaults come from the env var when set."""
    probe = Config()
    for f in fields(Config):
        env = probe.env_name(f.name)
        default = os.environ.get(env, f.default if f.default is not MISSING else None)
        kind = type(f.default)
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
