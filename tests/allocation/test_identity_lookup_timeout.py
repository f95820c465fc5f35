"""A container whose pod lookup did not answer within the budget (a loaded machine: the pod cache lags and the
direct LIST times out) is placed by node-local pairing, then named from the kubelet's PodResources once the pod
cache has its pod. When the cache catches up between the container's first resource and its second, the daemon
reads PodResources on the second call (it lists the first resource's devices by then): the pod's
gpushare.io/allocated record must still say every resource the kubelet gives the container, not only the first
(issue 14, defect 0: a record with the compute and without the memory the kubelet held). The real daemon, the
kubelet emulator and the fake apiserver."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from devplugin import contract as c
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import seed_node
from tests.support.daemon_harness import CORE, MEM, Running, _until, running


def before_second_resource(r: Running, hook: Callable[[str], None]) -> list[str]:
    """Run hook(resource) as the kubelet asks for a container's second resource (whichever it calls first: it
    walks a Go map); returns the resources in the order the kubelet asked for them."""
    asked: list[str] = []
    endpoints = r.kubelet._m.endpoints  # noqa: SLF001 - the emulator's device manager, as the kubelet calls it
    for resource in (MEM, CORE):
        endpoint = endpoints[resource]
        preferred = endpoint.get_preferred_allocation

        def hooked(available: list[str], must_include: list[str], size: int, resource: str = resource,
                   preferred: Callable[[list[str], list[str], int], list[str]] = preferred) -> list[str]:
            asked.append(resource)
            if len(asked) == 2:
                hook(resource)
            return preferred(available, must_include, size)

        endpoint.get_preferred_allocation = hooked  # type: ignore[method-assign]
    return asked


def record(r: Running, name: str) -> list[dict] | None:
    assert r.api is not None
    raw = r.api.pod("default", name)["metadata"].get("annotations", {}).get(c.ANN_ALLOCATED)
    return json.loads(raw)["containers"].get("main") if raw else None


@pytest.mark.parametrize("kubelet_seed", [1, 5])
def test_a_container_named_between_its_two_resources_is_recorded_whole(api: FakeApiserver,
                                                                        kubelet_seed: int) -> None:
    """The apiserver does not answer the first call's lookup (node-local pairing); the pod cache has the pod by the
    second call. The record says the memory and the compute the kubelet gave the container, on its GPU."""
    with running(seed_node(2, 80 * 1024), apiserver=api, seed=kubelet_seed) as r:
        assert r.registered_all() and r.nd is not None
        api.down()
        pod = api.add_pod(name="late", node_name=r.node_name, limits={MEM: "6", CORE: "30"})

        def cache_catches_up(resource: str) -> None:
            api.up()
            assert r.wait_cached(pod, timeout=15), "the pod cache did not see the pod once the apiserver was back"

        asked = before_second_resource(r, cache_catches_up)
        got = r.admit(pod).containers[0]  # type: ignore[attr-defined]
        assert len(asked) == 2, asked
        gpus = {i.split("::")[0] for ids in got.device_ids.values() for i in ids}
        assert len(gpus) == 1, got.device_ids
        [gpu] = gpus
        assert (len(got.device_ids[MEM]), len(got.device_ids[CORE])) == (6, 30)

        def whole() -> bool:
            r.nd.link.writer.flush(2)  # type: ignore[union-attr]
            rec = record(r, "late")
            return rec is not None and [(s["uuid"], s["mem"], s["core"]) for s in rec] == [(gpu, 6, 30)]

        assert _until(whole, 10), f"first asked {asked[0]}: record {record(r, 'late')}, the kubelet holds 6 GiB " \
                                  f"and 30 % on {gpu}"
