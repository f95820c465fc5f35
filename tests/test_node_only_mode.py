"""Node-only mode (the daemon with the apiserver, no scheduler extender): what it does without a scheduler's
choice. The real daemon, the kubelet emulator and the fake apiserver (issue 14, defects 2 and 3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import seed_node
from tests.daemon_harness import Running, running


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
