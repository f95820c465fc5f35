"""A change of the node's GPU mode while GPU pods run: logged, a Warning Event on the Node, applied (resources
re-registered) once no container holds GPU units. The real `devplugin serve` supervisor, in-process."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devplugin.app.serve import Supervisor
from devplugin.gpu.inventory import enumerate_gpus
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, load_in_process, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from tests.support.daemon_harness import CORE, MEM, _until, config, pod_spec, short_dir, the_one_event


@contextmanager
def serving(gpus: int, api_down: bool = False, **overrides: object) -> Iterator[tuple[FakeApiserver, KubeletEmulator,
                                                                                   Supervisor]]:
    """`devplugin serve`'s supervisor in a thread, on a fake node labelled core_mem, with a kubelet emulator."""
    root = short_dir()
    load_in_process()
    driver = FakeDriver.create(root / "drv", seed_node(gpus, 15360))
    os.environ["FAKE_NVML_CONFIG"] = str(driver.config_path)
    with FakeApiserver() as api:
        api.add_node("gpu-node", labels={"ack.node.gpu.schedule": "core_mem"})
        if api_down:
            api.down()
        cfg = config(root, node_name="gpu-node", kubeconfig=api.kubeconfig_path, mode="", health_port=0,
                     **overrides)
        kubelet = KubeletEmulator(Path(cfg.plugin_dir), Path(cfg.pod_resources_socket), grace_period_s=0)
        kubelet.start()
        sup = Supervisor(cfg, enumerate_gpus(), None)
        thread = threading.Thread(target=sup.run, daemon=True)
        thread.start()
        try:
            yield api, kubelet, sup
        finally:
            sup.stop_event.set()
            sup.changed.set()
            thread.join(timeout=15)
            kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)
        assert not thread.is_alive()


def test_relabel_waits_for_running_pods_then_applies() -> None:
    with serving(2) as (api, kubelet, sup):
        assert kubelet.wait_for(lambda k: k.allocatable().get(CORE) == 200 and k.allocatable().get(MEM) == 30,
                                timeout=15)
        pod = api.add_pod(name="busy", node_name="gpu-node", limits={MEM: "2", CORE: "10"})
        assert _until(lambda: sup.current is not None and sup.current.link.pods.get(pod["metadata"]["uid"])
                      is not None, 5)
        kubelet.admit(pod_spec(pod))
        api.patch_node("gpu-node", {"metadata": {"labels": {"ack.node.gpu.schedule": "cgpu"}}})

        ev = the_one_event(sup, api, "GPUModeChange")
        assert ev["type"] == "Warning" and ev["involvedObject"]["kind"] == "Node"
        assert "cgpu" in ev["message"] and "once the 1 container(s) holding GPU units end" in ev["message"]
        assert sup.settings.mode == "core_mem"  # not applied while the pod runs
        assert kubelet.allocatable().get(CORE) == 200
        # the pod ends: the change is applied, gpu-core.percentage is no longer served
        kubelet.remove_pod(pod["metadata"]["uid"])
        api.set_pod_phase("default", "busy", "Succeeded")
        assert _until(lambda: sup.settings.mode == "cgpu", 10)
        assert kubelet.wait_for(lambda k: k.allocatable().get(CORE, 0) == 0 and k.allocatable().get(MEM) == 30,
                                timeout=15)
        assert _until(lambda: sup.ready()[0], 10)


def test_an_apiserver_blip_at_start_delays_serving_instead_of_serving_nothing_forever() -> None:
    with serving(1, api_down=True, apiserver_timeout=0.5) as (api, kubelet, sup):
        assert _until(lambda: "apiserver" in sup.ready()[1], 5)
        assert not sup.ready()[0] and kubelet.allocatable().get(MEM, 0) == 0
        api.up()
        assert kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 15, timeout=20)
        assert _until(lambda: sup.ready()[0], 10)
