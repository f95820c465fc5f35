"""End to end: the extender binds a pod on the GPU it chose; the real node daemon (`devplugin serve`), admitting
the pod through the kubelet emulator, puts it on that GPU and records it. The extender reads the inventory the
daemon published and sees the room the daemon's pods hold."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplugin import contract as c
from devplugin.scheduler.cluster import KubeCluster
from devplugin.scheduler.extender import filter_nodes
from devplugin.scheduler.informer import start_informers
from devplugin.scheduler.state import ClusterState
from devplugin_sim.demo_cluster import NAMESPACE, NODE, DemoCluster
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from tests.scheduler.test_cluster import wait_for
from tests.support.scheduler_objects import CORE, MEM, bind


@pytest.fixture()
def node_and_extender() -> Iterator[tuple[DemoCluster, ClusterState]]:
    root = Path(tempfile.mkdtemp(prefix="gse2e-", dir="/tmp"))  # short: unix socket paths have 108 bytes
    driver = FakeDriver.create(root / "driver", seed_node(4, 15 * 1024))
    try:
        with FakeApiserver() as api, KubeletEmulator(root / "device-plugins", root / "pod-resources" / "kubelet.sock",
                                                     seed=3) as kubelet:
            api.add_node(NODE, labels={c.LABEL_MODE: "core_mem", c.LABEL_PLACEMENT: "binpack"})
            cl = DemoCluster(root, driver, api, kubelet, ["--shim", "off"])
            cl.serve()
            state = ClusterState()
            informers = start_informers(api.client(), state, watch_timeout_s=5)
            try:
                wait_for(lambda: (v := state.view(NODE)) is not None and len(v.gpus) == 4
                         and all(kubelet.allocatable().get(r, 0) > 0 for r in (MEM, CORE)),
                         timeout=60, what="the daemon's inventory and registration")
                yield cl, state
            finally:
                for inf in informers:
                    inf.stop()
                cl.kill_daemon()
    finally:
        driver.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_pod_bound_by_the_extender_is_admitted_on_the_chosen_gpu(
        node_and_extender: tuple[DemoCluster, ClusterState]) -> None:
    cl, state = node_and_extender
    cluster = KubeCluster(cl.api.client())
    uuids = [g.uuid for g in cl.driver.gpus]
    # Three pods placed by the daemon alone (created bound, as the default scheduler leaves them): 12 GiB each
    # on GPUs 0, 1, 2 (binpack), which leaves 3 GiB free on each of them and 15 on GPU 3.
    for i in range(3):
        cl.admit(cl.create_pod(f"fill-{i}", {MEM: 12}))
    wait_for(lambda: [g.mem_used for g in state.view(NODE).gpus] == [12, 12, 12, 0], timeout=20,
             what="the extender to see the daemon's placements")

    # Two pods bound by the extender before the kubelet admits either: binpack gives GPU 0 to the first (3 GiB)
    # and GPU 1 to the second (2 GiB; GPU 0 is now full). The kubelet then admits the SECOND first: the daemon's
    # own binpack would put it on GPU 0; it must follow the extender's choice, GPU 1, or the first pod would
    # find GPU 0 full. (The amounts differ: the kubelet's calls carry no pod name, the daemon tells pods apart
    # by what they ask.)
    asks = {"first": (3, 20), "second": (2, 10)}
    chosen = {}
    for name, (mem, core) in asks.items():
        p = cl.api.add_pod(name=name, namespace=NAMESPACE, limits={MEM: mem, CORE: core})
        wait_for(lambda name=name: state.pod(NAMESPACE, name), what=f"pod {name} in the extender's cache")
        assert filter_nodes(state, p, [NODE]).passed == [NODE]
        chosen[name] = bind(state, cluster, NAMESPACE, name, p["metadata"]["uid"], NODE)
    assert [s.index for s in chosen["first"].containers["main"]] == [0]
    assert [s.index for s in chosen["second"].containers["main"]] == [1]
    for name, gpu in (("second", 1), ("first", 0)):
        stored = cl.api.pod(NAMESPACE, name)
        assert c.ANN_SCHEDULED in stored["metadata"]["annotations"] and stored["spec"]["nodeName"] == NODE
        got = cl.admit(stored).containers[0]
        assert got.envs[c.ENV_NVIDIA_VISIBLE_DEVICES] == uuids[gpu]
        assert got.envs[c.ENV_ALIYUN_MEM_IDX] == str(gpu)
        record = wait_for_record(cl, name)
        assert [(s.index, s.mem, s.core) for s in record.containers["main"]] == [(gpu, *asks[name])]

    # Fragmentation: 1 + 3 + 15 GiB free; 16 asked fails with the reason.
    wait_for(lambda: [g.mem_used for g in state.view(NODE).gpus] == [15, 14, 12, 0], timeout=20,
             what="the extender's room after the admissions")
    big = cl.api.add_pod(name="big", namespace=NAMESPACE, limits={MEM: 16})
    assert filter_nodes(state, big, [NODE]).failed == {NODE: "GPU 0..3: at most 15 GiB free on one GPU, 16 GiB asked"}


def wait_for_record(cl: DemoCluster, name: str) -> c.PodAssignment:
    found: list[c.PodAssignment] = []
    wait_for(lambda: (r := cl.allocated(name)) is not None and found.append(r) is None, timeout=10,
             what=f"the daemon's {c.ANN_ALLOCATED} on {name}")
    return found[0]


def test_an_init_container_and_the_app_container_that_reuses_its_devices_land_on_the_chosen_gpu(
        node_and_extender: tuple[DemoCluster, ClusterState]) -> None:
    cl, state = node_and_extender
    cluster = KubeCluster(cl.api.client())
    uuids = [g.uuid for g in cl.driver.gpus]
    cl.admit(cl.create_pod("fill", {MEM: 10}))  # GPU 0: 5 GiB free; binpack puts a 4 GiB pod there
    wait_for(lambda: [g.mem_used for g in state.view(NODE).gpus] == [10, 0, 0, 0], timeout=20)
    lim = {"resources": {"limits": {MEM: "4"}, "requests": {MEM: "4"}}}
    p = cl.api.add_pod(name="warm", namespace=NAMESPACE, containers=[{"name": "main", "image": "x", **lim}],
                       init_containers=[{"name": "fetch", "image": "x", **lim}])
    wait_for(lambda: state.pod(NAMESPACE, "warm"), what="pod warm in the cache")
    chosen = bind(state, cluster, NAMESPACE, "warm", p["metadata"]["uid"], NODE)
    assert [s.index for s in chosen.containers["fetch"]] == [s.index for s in chosen.containers["main"]] == [0]
    got = cl.admit(cl.api.pod(NAMESPACE, "warm"))
    assert got.init_containers[0].envs[c.ENV_NVIDIA_VISIBLE_DEVICES] == uuids[0]
    assert got.container("main").envs[c.ENV_NVIDIA_VISIBLE_DEVICES] == uuids[0]
    assert not cl.events("warm", "Warning")
    wait_for(lambda: (h := state.held(p["metadata"]["uid"])) is not None and h.source == c.ANN_ALLOCATED
             and set(h.shares) == {"main"}, timeout=20, what="the daemon's record of the pair, counted once")
    record = wait_for_record(cl, "warm")
    assert record.containers["fetch"] == record.containers["main"]
    # counted once: from the daemon's usage once it is as recent as the record (until then the pod is in flight,
    # counted from its request on top of the usage: more, never less)
    wait_for(lambda: [g.mem_used for g in state.view(NODE).gpus] == [14, 0, 0, 0], timeout=10, what="14 GiB held")
