"""A slow apiserver (a loaded machine: the pod cache lags and the direct LIST does not answer within the lookup
budget) is waited for once more (--lookup-patience) before a container is placed by node-local pairing: pairing
cannot follow the scheduler's GPU choice, and on a loaded test cluster it placed a container's first resource on a
GPU where its second had no room, a refusal of a pod the extender had placed. An apiserver that refuses connections
answers at once and is not waited for. The real daemon, the kubelet emulator and the fake apiserver."""

from __future__ import annotations

import time

from devplugin import contract as c
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import seed_node
from tests.support.daemon_harness import CORE, MEM, running


def chosen(uuid: str) -> str:
    """The extender's choice: the container `main` on GPU `uuid` (index 2)."""
    return c.PodAssignment(node="gpu-node", time_ns=time.time_ns(), containers={
        "main": (c.GpuShare(index=2, uuid=uuid, mem=6, core=30),)}).render()


def placed_on(got: object) -> set[str]:
    return {i.split("::")[0] for ids in got.device_ids.values() for i in ids}  # type: ignore[attr-defined]


def test_a_slow_apiserver_is_waited_for_and_the_schedulers_choice_followed(api: FakeApiserver) -> None:
    with running(seed_node(4, 16 * 1024), apiserver=api, placement="binpack") as r:
        assert r.registered_all()
        gpu2 = r.driver.gpus[2].uuid
        api.down("reset")  # cut the pod cache's watch: it will not see the pod before the admission
        pod = api.add_pod(name="slow", node_name=r.node_name, limits={MEM: "6", CORE: "30"},
                          annotations={c.ANN_SCHEDULED: chosen(gpu2)})
        api.up()
        api.delay(1.2)  # every request, the direct LIST and the cache's relist, answers after 1.2 s (budget 0.3 s)
        t0 = time.monotonic()
        got = r.admit(pod).containers[0]  # type: ignore[attr-defined]
        took = time.monotonic() - t0
        api.delay(0)
        assert placed_on(got) == {gpu2}, f"placed on {placed_on(got)}, the extender chose {gpu2}"
        assert (len(got.device_ids[MEM]), len(got.device_ids[CORE])) == (6, 30)
        assert took < 6, f"the admission waited {took:.1f} s"


def test_an_apiserver_that_refuses_is_not_waited_for(api: FakeApiserver) -> None:
    with running(seed_node(4, 16 * 1024), apiserver=api, placement="binpack") as r:
        assert r.registered_all()
        api.down("refuse")
        pod = api.add_pod(name="down", node_name=r.node_name, limits={MEM: "6", CORE: "30"},
                          annotations={c.ANN_SCHEDULED: chosen(r.driver.gpus[2].uuid)})
        t0 = time.monotonic()
        got = r.admit(pod).containers[0]  # type: ignore[attr-defined]
        took = time.monotonic() - t0
        assert len(placed_on(got)) == 1 and (len(got.device_ids[MEM]), len(got.device_ids[CORE])) == (6, 30)
        assert took < 3, f"the admission waited {took:.1f} s for an apiserver that refuses connections"
