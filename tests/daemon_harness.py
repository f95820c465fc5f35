"""Run the real daemon in-process (the same `serve.build` path as `devplugin serve`) against the kubelet emulator
and the fake driver, over real unix sockets."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devplugin.app.config import Config
from devplugin.app.serve import build, shim_mounts
from devplugin.deviceplugin.daemon import Daemon
from devplugin.gpu.health import HealthWatcher
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, load_in_process, seed_node
from devplugin_sim.kubelet import KubeletEmulator

DOMAIN = "aliyun.com"
MEM, CORE, COUNT = f"{DOMAIN}/gpu-mem", f"{DOMAIN}/gpu-core.percentage", f"{DOMAIN}/gpu-count"


def short_dir() -> Path:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path is too long."""
    return Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))


@dataclass
class Running:
    root: Path
    driver: FakeDriver
    kubelet: KubeletEmulator
    daemon: Daemon
    health: HealthWatcher
    plugin_dir: Path
    pod_resources: Path
    daemon_config: Config

    def registered_all(self, resources: tuple[str, ...] = (MEM, CORE, COUNT), timeout: float = 10) -> bool:
        return self.kubelet.wait_for(
            lambda k: all(k.allocatable().get(r, 0) > 0 for r in resources), timeout=timeout
        )


def config(root: Path, **overrides: object) -> Config:
    cfg = Config(mode="core_mem", plugin_dir=str(root / "dp"), pod_resources_socket=str(root / "pr" / "kubelet.sock"),
                 node_name="", shim="off", recovery_seconds=0.5, shim_state_dir=str(root / "shim"),
                 state_dir=str(root / "state"))
    for key, value in overrides.items():
        setattr(cfg, key, value)
    cfg.validate()
    return cfg


@contextmanager
def running(gpus: list[FakeGPU] | None = None, *, seed: int = 1, **overrides: object) -> Iterator[Running]:
    root = short_dir()
    load_in_process()
    driver = FakeDriver.create(root / "drv", gpus or seed_node(4, 15360))
    os.environ["FAKE_NVML_CONFIG"] = str(driver.config_path)
    cfg = config(root, **overrides)
    kubelet = KubeletEmulator(Path(cfg.plugin_dir), Path(cfg.pod_resources_socket), seed=seed)
    kubelet.start()
    built = build(cfg, mounts=shim_mounts(cfg))
    assert built is not None
    daemon, health = built
    daemon.start()
    health.start()
    r = None
    try:
        r = Running(root, driver, kubelet, daemon, health, Path(cfg.plugin_dir), Path(cfg.pod_resources_socket), cfg)
        yield r
    finally:
        (r.health if r else health).stop()
        (r.daemon if r else daemon).stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
