"""Node-only mode (the daemon with the apiserver, no scheduler extender): what it does without a scheduler's
choice. The real daemon, the kubelet emulator and the fake apiserver (issue 14, defects 2 and 3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin.app.config import Config
from devplugin.app.serve import settings_from
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import seed_node
from devplugin_sim.kubelet import AdmissionError
from tests.support.daemon_harness import CORE, COUNT, MEM, Running, running


@pytest.fixture
def r(api: FakeApiserver) -> Iterator[Running]:
    with running(seed_node(2, 15360), apiserver=api) as run:
        assert run.registered_all()
        yield run


def on_gpu(r: Running, name: str, gpu: int, **limits: int) -> None:
    """A running pod the scheduler put on this GPU."""
    share = c.GpuShare(gpu, "", limits.get("mem", 0), limits.get("core", 0))
    ann = {c.ANN_SCHEDULED: c.PodAssignment(r.node_name, 1, {"main": (share,)}).render()}
    pod = r.pod(name, annotations=ann, **limits)
    assert r.wait_cached(pod)
    got = r.admit(pod).containers[0]  # type: ignore[attr-defined]
    assert {i.split("::")[0] for ids in got.device_ids.values() for i in ids} == {r.driver.gpus[gpu].uuid}


def test_a_pods_containers_are_planned_together(r: Running) -> None:
    """GPU 0: 10 GiB and 100 % free; GPU 1: 12 GiB and 20 % free. The first container (2 GiB, 10 %) fits on
    both, and binpack alone puts it on GPU 0, the only GPU with room for the second (9 GiB, 50 %) (defect 2)."""
    on_gpu(r, "f0", 0, mem=5)
    on_gpu(r, "f1", 1, mem=3, core=80)
    pod = r.pod("two", containers=[{"name": "small", "limits": {"mem": 2, "core": 10}},
                                   {"name": "large", "limits": {"mem": 9, "core": 50}}])
    assert r.wait_cached(pod)
    got = r.admit(pod)
    gpus = {ct.name: {i.split("::")[0] for ids in ct.device_ids.values() for i in ids}
            for ct in got.containers}  # type: ignore[attr-defined]
    assert gpus == {"small": {r.driver.gpus[1].uuid}, "large": {r.driver.gpus[0].uuid}}


def test_gpus_kept_whole_by_a_node_label_keep_allocatable_gpu_count_true(api: FakeApiserver) -> None:
    """Without the extender the default scheduler counts allocatable gpu-count, which the kubelet publishes every
    10 s: a GPU that took slices since is still counted. With gpushare.io/whole-gpus: "1" the last GPU serves
    gpu-count only and the others slices only, so allocatable never changes with use (defect 3)."""
    with running(seed_node(2, 15360), apiserver=api, whole_gpus=1) as r:
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 1 and k.allocatable().get(MEM) == 15)
        assert r.kubelet.allocatable().get(CORE) == 100
        shared = r.pod("s", mem=4, core=50)
        assert r.wait_cached(shared)
        got = r.admit(shared).containers[0]  # type: ignore[attr-defined]
        assert {i.split("::")[0] for ids in got.device_ids.values() for i in ids} == {r.driver.gpus[0].uuid}
        whole = r.pod("w", count=1)
        assert r.wait_cached(whole)
        got = r.admit(whole).containers[0]  # type: ignore[attr-defined]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == r.driver.gpus[1].uuid
        assert r.kubelet.allocatable() == {MEM: 15, CORE: 100, COUNT: 1}  # as before: nothing to go stale
        big = r.pod("big", mem=12, core=10)  # fits GPU 1's memory, but GPU 1 is kept whole
        assert r.wait_cached(big)
        with pytest.raises(AdmissionError):
            r.admit(big)


def test_the_label_is_read_with_the_node_mode_and_a_bad_value_is_named() -> None:
    cfg = Config(mode="core_mem")
    assert settings_from({c.LABEL_MODE: "core_mem", c.LABEL_WHOLE_GPUS: "2"}, cfg, 8).whole_gpus == 2  # type: ignore
    bad = settings_from({c.LABEL_MODE: "core_mem", c.LABEL_WHOLE_GPUS: "9"}, cfg, 8)
    assert bad is not None and bad.whole_gpus == 0
    assert bad.problem == (f"node label {c.LABEL_WHOLE_GPUS}='9' is not a number of GPUs from 0 to 8; no GPU is kept "
                           "for gpu-count")
