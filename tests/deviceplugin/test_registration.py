"""The daemon registers its resources with the kubelet and stays registered across kubelet restarts."""

from __future__ import annotations

import os

from devplugin.allocation.units import Kind
from devplugin.deviceplugin.daemon import socket_name
from tests.support.daemon_harness import CORE, COUNT, MEM, running


def test_seed_node_allocatable() -> None:
    with running() as r:
        assert r.registered_all()
        assert r.kubelet.allocatable() == {CORE: 400, COUNT: 4, MEM: 60}
        assert r.kubelet.capacity() == {CORE: 400, COUNT: 4, MEM: 60}
        assert all(o.get_preferred_allocation_available for o in r.kubelet.registered().values())


def test_reregisters_after_kubelet_restart() -> None:
    with running() as r:
        assert r.registered_all()
        before = r.kubelet.registrations()
        r.kubelet.restart()
        assert r.kubelet.wait_for(lambda k: k.registrations() >= before + 3, timeout=10)
        assert r.registered_all()
        assert r.kubelet.allocatable() == {CORE: 400, COUNT: 4, MEM: 60}


def test_serves_and_reregisters_when_its_socket_is_removed() -> None:
    with running() as r:
        assert r.registered_all()
        before = r.kubelet.registrations()
        path = r.plugin_dir / socket_name("aliyun.com", Kind.MEM)
        os.unlink(path)
        assert r.kubelet.wait_for(lambda k: k.registrations() >= before + 1, timeout=10)
        assert path.exists()
        assert r.registered_all()


def test_cgpu_mode_serves_memory_and_count_only() -> None:
    with running(mode="cgpu") as r:
        assert r.registered_all((MEM, COUNT))
        assert set(r.kubelet.allocatable()) == {MEM, COUNT}


def test_mixed_sizes_keep_their_own_size() -> None:
    from devplugin_sim.fake_driver import FakeGPU

    gpus = [FakeGPU(index=i, uuid=f"GPU-aaaaaaaa-0000-0000-0000-00000000000{i}", name="mixed",
                    memory_mib=m, minor=i, pci_bus_id=f"00000000:0{i + 1}:00.0", numa_node=0, sms=100)
            for i, m in enumerate([81920, 81920, 24576, 24576])]
    with running(gpus) as r:
        assert r.registered_all()
        assert r.kubelet.allocatable()[MEM] == 80 + 80 + 24 + 24


def test_waits_for_a_missing_kubelet_then_registers() -> None:
    import shutil

    from devplugin.app.node_daemon import build
    from devplugin.gpu.inventory import enumerate_gpus
    from devplugin_sim.fake_driver import FakeDriver, load_in_process, seed_node
    from devplugin_sim.kubelet import KubeletEmulator
    from tests.support.daemon_harness import config, short_dir

    root = short_dir()
    load_in_process()
    driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
    os.environ["FAKE_NVML_CONFIG"] = str(driver.config_path)
    cfg = config(root)
    daemon = build(cfg, enumerate_gpus(), cfg.mode, cfg.placement).daemon
    daemon.start()  # no kubelet.sock yet: the daemon serves and waits
    try:
        kubelet = KubeletEmulator(r_dir := root / "dp", root / "pr" / "kubelet.sock")
        assert (r_dir / socket_name("aliyun.com", Kind.MEM)).exists()
        kubelet.start()  # like a kubelet start: sockets wiped, kubelet.sock created
        try:
            assert kubelet.wait_for(lambda k: k.allocatable() == {MEM: 30, CORE: 200, COUNT: 2}, timeout=10)
        finally:
            kubelet.stop()
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
