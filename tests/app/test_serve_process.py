"""`devplugin serve` as a process: --help, clean SIGTERM, refusing bad settings, labels from the apiserver."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from tests.support.daemon_harness import COUNT, MEM, short_dir


def serve(driver: FakeDriver, root: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, **driver.env()}
    cmd = [sys.executable, "-m", "devplugin", "serve", "--plugin-dir", str(root / "dp"),
           "--pod-resources-socket", str(root / "pr.sock"), "--shim", "off", "--state-dir", str(root / "state"),
           *(args if "--health-port" in args else ("--health-port", "0", *args))]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_help_explains_every_flag_and_its_env() -> None:
    out = subprocess.run([sys.executable, "-m", "devplugin", "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for flag, env in [("--mem-unit", "DEVPLUGIN_MEM_UNIT"), ("--mode", "DEVPLUGIN_MODE"),
                      ("--node-name", "NODE_NAME"), ("--ignored-xids", "DEVPLUGIN_IGNORED_XIDS")]:
        assert flag in out and env in out


def test_bad_flag_value_exits_2_with_advice() -> None:
    proc = subprocess.run([sys.executable, "-m", "devplugin", "serve", "--mem-unit", "100MiB"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "512MiB" in proc.stderr


def test_env_var_sets_a_flag() -> None:
    env = {**os.environ, "DEVPLUGIN_MEM_UNIT": "3GiB"}
    proc = subprocess.run([sys.executable, "-m", "devplugin", "serve"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "'3GiB'" in proc.stderr


def test_sigterm_stops_cleanly_and_removes_sockets() -> None:
    root = short_dir()
    try:
        driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            proc = serve(driver, root, "--mode", "core_mem", "--node-name", "")
            assert kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 2, timeout=20)
            assert len(list((root / "dp").glob("aliyun.com-*.sock"))) == 3
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=15)
            assert proc.returncode == 0, out
            assert list((root / "dp").glob("aliyun.com-*.sock")) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_unit_too_fine_for_eight_h200s_is_refused() -> None:
    root = short_dir()
    try:
        gpus = [FakeGPU(index=i, uuid=f"GPU-bbbbbbbb-0000-0000-0000-00000000000{i}", name="NVIDIA H200",
                        memory_mib=141 * 1024, minor=i, pci_bus_id=f"00000000:0{i + 1}:00.0", numa_node=0, sms=132)
                for i in range(8)]
        driver = FakeDriver.create(root / "drv", gpus)
        proc = serve(driver, root, "--mode", "core_mem", "--mem-unit", "1MiB")
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 2
        assert "over the kubelet's 4 MiB gRPC limit" in out and "use --mem-unit 32MiB or coarser" in out
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def fake_apiserver(labels: dict[str, str]) -> Iterator[str]:
    """The fake apiserver with node gpu-node-1 carrying `labels`; yields its kubeconfig path."""
    with FakeApiserver() as api:
        api.add_node("gpu-node-1", labels=labels)
        yield api.kubeconfig_path


def test_mode_and_placement_come_from_node_labels() -> None:
    root = short_dir()
    try:
        driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
        labels = {"ack.node.gpu.schedule": "cgpu", "ack.node.gpu.placement": "spread"}
        with fake_apiserver(labels) as kubeconfig, KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            proc = serve(driver, root, "--node-name", "gpu-node-1", "--kubeconfig", kubeconfig, "--mode", "core_mem")
            assert kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 30 and COUNT in k.allocatable(), timeout=20)
            assert set(kubelet.allocatable()) == {MEM, COUNT}  # cgpu: no gpu-core.percentage
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=15)
            assert "node label ack.node.gpu.schedule=cgpu" in out and "placement spread" in out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_unserved_mode_serves_nothing_and_says_why() -> None:
    root = short_dir()
    try:
        driver = FakeDriver.create(root / "drv", seed_node(1, 15360))
        with fake_apiserver({"ack.node.gpu.schedule": "default"}) as kubeconfig:
            proc = serve(driver, root, "--node-name", "gpu-node-1", "--kubeconfig", kubeconfig)
            killer = threading.Timer(20, proc.kill)
            killer.start()
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if "serving nothing" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            out = "".join(seen) + proc.communicate(timeout=10)[0]
            killer.cancel()
            assert proc.returncode == 0
            assert "node mode 'default'" in out and "serving nothing" in out
            assert not list((root / "dp").glob("*.sock")) if (root / "dp").exists() else True
    finally:
        shutil.rmtree(root, ignore_errors=True)
