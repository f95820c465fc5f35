"""MIG devices served as GPUs of their own by the real daemon (kubelet emulator, fake driver in MIG mode): what
the node advertises, what a container placed in a MIG device gets, and a MIG layout that changes or waits for a
reset while pods hold shares: nothing given twice, no holding forgotten, an Event on the Node."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devplugin import contract as c
from devplugin.app.serve import Supervisor
from devplugin.gpu.inventory import enumerate_gpus
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, load_in_process
from devplugin_sim.kubelet import KubeletEmulator
from devplugin_sim.mig_layouts import a100, mig_node
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.support.daemon_harness import CORE, COUNT, MEM, _until, config, pod_spec, running, short_dir, the_one_event

# mig_node(): two whole A100 80GB (80 GiB units each) and one split into 3g.40gb (39), 2g.20gb (19), 1g.10gb (9).
ADVERTISED = {MEM: 80 + 80 + 39 + 19 + 9, CORE: 500, COUNT: 5}


def pod(name: str, **limits: int) -> PodSpec:
    names = {"mem": MEM, "core": CORE, "count": COUNT}
    return PodSpec(name=name, containers=[ContainerSpec(name="main", limits={names[k]: v for k, v in limits.items()})])


def test_each_mig_device_is_a_gpu_to_share_and_the_mig_gpu_itself_is_not() -> None:
    gpus = mig_node()
    with running(gpus) as r:
        assert r.registered_all()
        assert r.kubelet.wait_for(lambda k: k.allocatable() == ADVERTISED, timeout=5)
        served = {g.uuid: g for g in r.daemon.node.gpus}
        assert gpus[1].uuid not in served
        small = served[gpus[1].mig_devices[2].uuid]
        assert (small.parent_uuid, small.parent_index, small.mig_profile) == (gpus[1].uuid, 1, "1g.10gb")
        assert sorted(g.index for g in served.values()) == [0, 2, 3, 4, 5]  # MIG devices after the 3 GPUs


def test_a_share_placed_in_a_mig_device_gets_its_uuid_and_a_slice_of_it() -> None:
    gpus = mig_node()
    with running(gpus) as r:
        assert r.registered_all()
        # binpack: the 3g.40gb (39 units) is the fullest device 30 units fit in
        got = r.kubelet.admit(pod("in-mig", mem=30, core=50)).containers[0]
        three_g = gpus[1].mig_devices[0].uuid
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == three_g
        assert got.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "30720m"
        assert got.envs["CUDA_DEVICE_SM_LIMIT"] == "50"
        assert got.envs["ALIYUN_COM_GPU_MEM_DEV"] == "39"  # the MIG device's memory, not its GPU's 80
        whole = r.kubelet.admit(pod("whole", count=1)).containers[0]
        assert whole.envs["NVIDIA_VISIBLE_DEVICES"] != gpus[1].uuid


def test_a_gpu_waiting_for_a_mig_reset_takes_no_new_pods() -> None:
    gpus = [a100("pend", 0, mig=False), a100("pend", 1, mig=False, mig_pending=True)]
    with running(gpus, mig_check_interval=0.2) as r:
        assert r.registered_all()
        assert r.kubelet.wait_for(lambda k: k.allocatable() == {MEM: 80, CORE: 100, COUNT: 1}, timeout=5)
        assert r.kubelet.capacity() == {MEM: 160, CORE: 200, COUNT: 2}
        for i in range(3):
            got = r.kubelet.admit(pod(f"p{i}", mem=10, core=10)).containers[0]
            assert got.envs["NVIDIA_VISIBLE_DEVICES"] == gpus[0].uuid


def test_an_xid_of_a_gpu_in_mig_mode_takes_its_mig_devices_out_until_it_recovers() -> None:
    with running(mig_node(), recovery_seconds=0.5) as r:
        assert r.registered_all()
        assert r.kubelet.wait_for(lambda k: k.allocatable() == ADVERTISED, timeout=5)
        r.driver.raise_xid(1, 8)  # transient, on the GPU whose MIG devices are served
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 160 and k.allocatable().get(COUNT) == 2,
                                  timeout=5)
        assert r.kubelet.wait_for(lambda k: k.allocatable() == ADVERTISED, timeout=5)


def test_metrics_show_each_mig_device_under_its_gpu() -> None:
    from tests.app.test_metrics_node import scrape
    gpus = mig_node()
    with running(gpus, health_port=0) as r:
        assert r.registered_all()
        samples = scrape(r)
        mig = {labels["uuid"]: labels for labels, value in samples["gpushare_gpu_mig_device_info"] if value == 1}
        assert {u: (m["parent_uuid"], m["parent_gpu"], m["profile"]) for u, m in mig.items()} == {
            d.uuid: (gpus[1].uuid, "1", d.profile) for d in gpus[1].mig_devices}
        caps = {labels["uuid"]: value for labels, value in samples["gpushare_gpu_memory_capacity_units"]}
        assert caps[gpus[1].mig_devices[2].uuid] == 9 and gpus[1].uuid not in caps


@contextmanager
def serving(gpus: list[FakeGPU], **overrides: object) -> Iterator[tuple[FakeApiserver, KubeletEmulator, Supervisor,
                                                                         FakeDriver]]:
    """`devplugin serve`'s supervisor in a thread, on a fake MIG node labelled core_mem, with a kubelet emulator."""
    root = short_dir()
    load_in_process()
    driver = FakeDriver.create(root / "drv", gpus)
    os.environ["FAKE_NVML_CONFIG"] = str(driver.config_path)
    with FakeApiserver() as api:
        api.add_node("gpu-node", labels={"ack.node.gpu.schedule": "core_mem"})
        cfg = config(root, node_name="gpu-node", kubeconfig=api.kubeconfig_path, mode="", health_port=0,
                     mig_check_interval=0.2, **overrides)
        kubelet = KubeletEmulator(Path(cfg.plugin_dir), Path(cfg.pod_resources_socket), grace_period_s=0)
        kubelet.start()
        sup = Supervisor(cfg, enumerate_gpus(), None)
        thread = threading.Thread(target=sup.run, daemon=True)
        thread.start()
        try:
            yield api, kubelet, sup, driver
        finally:
            sup.stop_event.set()
            sup.changed.set()
            thread.join(timeout=15)
            kubelet.stop()
            driver.close()
            shutil.rmtree(root, ignore_errors=True)
        assert not thread.is_alive()


def inventory(api: FakeApiserver) -> c.NodeInventory:
    return c.parse_inventory(api.node("gpu-node")["metadata"]["annotations"][c.ANN_NODE_GPUS])


def test_mig_devices_change_under_a_held_share_the_holding_is_kept_and_nothing_new_lands_there() -> None:
    gpus = mig_node()
    with serving(gpus) as (api, kubelet, sup, driver):
        assert kubelet.wait_for(lambda k: k.allocatable() == ADVERTISED, timeout=15)
        inv = inventory(api)
        assert {g.uuid: (g.parent_uuid, g.mig_profile) for g in inv.gpus if g.parent_uuid} == {
            m.uuid: (gpus[1].uuid, m.profile) for m in gpus[1].mig_devices}
        held = api.add_pod(name="held", node_name="gpu-node", limits={MEM: "30", CORE: "50"})
        assert _until(lambda: sup.current is not None and sup.current.link.pods.get(held["metadata"]["uid"])
                      is not None, 5)
        got = kubelet.admit(pod_spec(held)).containers[0]
        three_g = gpus[1].mig_devices[0].uuid
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == three_g
        first = sup.current

        # The operator destroys GPU 1's instances and makes one 7g.80gb while the pod runs.
        driver.rewrite([gpus[0], a100("mig", 1, mig=True, profiles=("7g.80gb",)), gpus[2]])

        ev = the_one_event(sup, api, "GPUMigLayoutChanged")
        assert ev["type"] == "Warning" and ev["involvedObject"]["kind"] == "Node"
        assert gpus[1].uuid in ev["message"] and "drain" in ev["message"]
        # GPU 1's old MIG devices are Unhealthy: allocatable drops by 39 + 19 + 9, capacity is kept, so is the pod
        assert kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 160, timeout=10)
        assert kubelet.capacity() == ADVERTISED
        assert sup.current is first  # not rebuilt while the share is held
        assert not inventory(api).gpus[[g.uuid for g in inventory(api).gpus].index(three_g)].healthy
        for i in range(4):  # new shares land on the whole GPUs only
            p = api.add_pod(name=f"new{i}", node_name="gpu-node", limits={MEM: "5", CORE: "5"})
            assert _until(lambda p=p: sup.current.link.pods.get(p["metadata"]["uid"]) is not None, 5)
            new = kubelet.admit(pod_spec(p)).containers[0]
            assert new.envs["NVIDIA_VISIBLE_DEVICES"] in (gpus[0].uuid, gpus[2].uuid)

        # The held pod ends: the new layout is served (the 7g.80gb device, 79 units).
        kubelet.remove_pod(held["metadata"]["uid"])
        api.set_pod_phase("default", "held", "Succeeded")
        assert _until(lambda: sup.current is not None and sup.current is not first, 15)
        assert kubelet.wait_for(lambda k: k.capacity().get(MEM) == 80 + 80 + 79 and k.capacity().get(COUNT) == 3,
                                timeout=15)
        assert _until(lambda: any(g.mig_profile == "7g.80gb" for g in inventory(api).gpus), 10)
