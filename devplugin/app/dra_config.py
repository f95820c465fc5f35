"""`devplugin dra` settings: one typed dataclass; every flag is also settable by an env var (DEVPLUGIN_DRA_<FLAG>,
NODE_NAME for the node)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from devplugin import contract
from devplugin.app.config import METRICS_AUTH, Settings, _opt
from devplugin.gpu.health import DEFAULT_IGNORED_XIDS, DEFAULT_RESET_XIDS

ENV_PREFIX = "DEVPLUGIN_DRA_"


@dataclass
class DraConfig(Settings):
    env_prefix = ENV_PREFIX

    node_name: str = _opt("", "this node's name: the ResourceSlices' pool and nodeName, and the node whose label "
                          f"{contract.LABEL_ALLOCATION}={contract.ALLOCATION_DRA} turns DRA on", env="NODE_NAME")
    kubeconfig: str = _opt("", "kubeconfig for the apiserver (empty: in-cluster config, then ~/.kube/config)")
    plugins_registry_dir: str = _opt("/var/lib/kubelet/plugins_registry", "the kubelet's plugin watcher directory: "
                                     "the registration socket goes here")
    plugin_dir: str = _opt(f"/var/lib/kubelet/plugins/{contract.DRA_DRIVER}", "directory of the DRA socket "
                           "(dra.sock, the endpoint the kubelet calls) and of the checkpoint of prepared claims")
    cdi_dir: str = _opt("/var/run/cdi", "where the CDI specs of prepared claims are written (the container "
                        "runtime's CDI spec directory)")
    shim: str = _opt("auto", "deliver the isolation shim to shares: auto (when --shim-lib exists), on, off",
                     choices=("auto", "on", "off"))
    shim_lib: str = _opt("/usr/local/gpushare/lib/libgpushare.so", "host path of the shim library")
    shim_state_dir: str = _opt("/var/run/gpushare", "host directory for per-claim limits and accounting")
    state_dir: str = _opt("/var/lib/gpushare", "host directory for GPU health that outlives the plugin")
    ignored_xids: str = _opt(",".join(str(x) for x in sorted(DEFAULT_IGNORED_XIDS)),
                             "comma-separated XIDs that do not mark a GPU unhealthy")
    reset_xids: str = _opt(",".join(str(x) for x in sorted(DEFAULT_RESET_XIDS)),
                           "comma-separated XIDs after which a GPU stays unhealthy until it is reset")
    mig_check_interval: float = _opt(
        10.0, "seconds between reads of each GPU's MIG mode and MIG devices: the devices of a GPU whose MIG mode waits "
        "for a reset or whose MIG devices changed are tainted NoSchedule", maximum=3600.0)
    recovery_seconds: float = _opt(60.0, "an unhealthy GPU quiet for this long turns healthy (not --reset-xids)",
                                   maximum=86400.0)
    resync_seconds: float = _opt(30.0, "how often the ResourceSlices are compared with the apiserver's (a health "
                                 "change is published at once)", maximum=3600.0)
    health_port: int = _opt(8090, "port of /healthz and /readyz, the DaemonSet's probes, on every address (0: none)")
    metrics_port: int = _opt(0, "port of /metrics (Prometheus; 0: none; the DaemonSet serves it on 8092)")
    metrics_address: str = _opt("127.0.0.1", "address /metrics listens on: loopback by default; 0.0.0.0 (every "
                                "address) for a scraper outside the pod, with --metrics-auth kubernetes")
    metrics_auth: str = _opt("none", "who may read /metrics: none (whoever reaches --metrics-address) or kubernetes "
                             "(a bearer token the apiserver authenticates and allows get on /metrics)",
                             choices=METRICS_AUTH)
    log_format: str = _opt("text", "log format", choices=("text", "json"))
    log_level: str = _opt("INFO", "log level", choices=("DEBUG", "INFO", "WARNING", "ERROR"))

    def validate(self) -> None:
        """ValueError naming the setting that is wrong and how to fix it."""
        self.check_common()
        if not self.node_name:
            raise ValueError("no node name: set NODE_NAME from the downward API (spec.nodeName) or --node-name; the "
                             "ResourceSlices are this node's")
        for name in ("plugins_registry_dir", "plugin_dir", "cdi_dir", "state_dir", "shim_state_dir"):
            if not getattr(self, name):
                raise ValueError(f"--{name.replace('_', '-')} must name a directory")


def dra_from_args(ns: argparse.Namespace) -> DraConfig:
    cfg = DraConfig(**{f.name: getattr(ns, f.name) for f in fields(DraConfig)})
    cfg.validate()
    return cfg
