"""filter's and prioritize's answers kept per ask (devplugin/scheduler/ask_answers.py) are the answers computed
afresh, call after call, while the cluster changes between calls as it does in a cluster: pods bound, assumed by
bind, seen bound, ended and deleted, assumptions expired, nodes relabelled, republishing their usage, deleted and
added, the kept list of changes emptied. Every node passed, failed or unresolvable alike with the same words, and
prioritize's JSON byte for byte, for pods asking one share (new, or held already and filtered again)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devplugin.allocation.requests import pod_request
from devplugin.contract import GpuShare
from devplugin.scheduler import extender
from devplugin.scheduler import state as state_module
from devplugin.scheduler.state import ClusterState
from tests.scheduler.answers_before import filter_before, prioritize_before
from tests.scheduler.test_one_share import SIZES, USAGE_TIME, _counted, gpu_usage, held_pod
from tests.support.scheduler_objects import container, node, pod

ASKS = [(1, 0), (4, 20), (8, 0), (12, 50), (16, 100), (24, 5)]  # few, so the same ask comes back after changes


@st.composite
def a_node(draw: Any, name: str, pods: list[dict]) -> dict:
    gpus = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from(SIZES)) for _ in range(gpus)]
    usage = draw(st.sampled_from(("daemon", "random", "none")))
    counts = (_counted(pods, gpus) if usage == "daemon" else
              {g: draw(gpu_usage(sizes[g])) for g in draw(st.sets(st.integers(0, gpus - 1)))}
              if usage == "random" else None)
    return node(name, gpus=gpus, sizes=sizes, mode=draw(st.sampled_from(("core_mem", "core_mem", "cgpu", "share"))),
                placement=draw(st.sampled_from(("binpack", "spread", None))),
                unhealthy=tuple(draw(st.sets(st.integers(0, gpus - 1), max_size=1))), usage=counts,
                usage_time_ns=USAGE_TIME)


class World:
    """A cluster state and what the test put in it, with a clock it moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.state = ClusterState(clock=lambda: self.now, assume_ttl_s=30)
        self.pods: dict[str, dict] = {}  # name -> the pod as last upserted
        self.names = [f"n{i}" for i in range(5)]
        self.serial = 0

    def asker(self, draw: Any) -> dict:
        """The pod that asks: new, or one held already (its own holding left out on its node)."""
        mem, core = draw(st.sampled_from(ASKS))
        asks = pod("asks", containers=[container(mem=mem, core=core)])
        if self.pods and draw(st.integers(0, 3)) == 0:
            asks["metadata"]["uid"] = self.pods[draw(st.sampled_from(sorted(self.pods)))]["metadata"]["uid"]
        return asks

    def step(self, draw: Any) -> None:
        kind = draw(st.sampled_from(("pod", "pod", "assume", "delete_pod", "node", "delete_node", "expire")))
        name = draw(st.sampled_from(self.names))
        if kind == "pod":  # a pod seen bound with its GPUs, or a held one seen again (its record, its phase)
            self.serial += 1
            p = draw(held_pod(name, 4, self.serial))
            if self.pods and draw(st.booleans()):
                p["metadata"]["uid"] = self.pods[draw(st.sampled_from(sorted(self.pods)))]["metadata"]["uid"]
            if draw(st.integers(0, 5)) == 0:
                p["status"]["phase"] = "Succeeded"  # ended: holds nothing
            self.pods[p["metadata"]["name"]] = p
            self.state.upsert_pod(p)
        elif kind == "assume":  # bind's choice, before the watch shows it
            self.serial += 1
            mem, core = draw(st.sampled_from(ASKS))
            p = pod(f"a{self.serial}", containers=[container(mem=mem, core=core)])
            self.state.assume(pod_request(p), name, {"main": (GpuShare(draw(st.integers(0, 3)), "", mem, core),)})
        elif kind == "delete_pod" and self.pods:
            self.state.delete_pod(self.pods.pop(draw(st.sampled_from(sorted(self.pods)))))
        elif kind == "node":  # added, relabelled, a GPU unhealthy, the daemon's usage republished
            self.state.upsert_node(draw(a_node(name, [p for p in self.pods.values()
                                                      if p["spec"].get("nodeName") == name])))
        elif kind == "delete_node":
            self.state.delete_node(name)
        else:
            self.now += draw(st.sampled_from((1.0, 31.0)))
            self.state.expire()


def check(world: World, asks: dict, names: list[str]) -> None:
    before = filter_before(world.state, asks, names), prioritize_before(world.state, asks, names)
    out = extender.filter_nodes(world.state, asks, names)
    assert (out.passed, out.failed, out.unresolvable) == before[0]
    assert extender.prioritize_json(world.state, asks, names) == json.dumps(
        [{"Host": h, "Score": s} for h, s in before[1]])


@pytest.mark.parametrize("kept", [4096, 3])  # the production bound, and one that empties the list every few changes
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # set once, alike
@given(data=st.data())
def test_kept_answers_follow_a_changing_cluster(kept: int, data: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "MIN_CHANGES_KEPT", kept)
    world = World()
    for name in world.names[:data.draw(st.integers(1, 5))]:
        world.state.upsert_node(data.draw(a_node(name, [])))
    for _ in range(data.draw(st.integers(1, 12))):
        for _ in range(data.draw(st.integers(0, 4))):
            world.step(data.draw)
        names = data.draw(st.lists(st.sampled_from(world.names + ["ghost"]), max_size=7))
        check(world, world.asker(data.draw), names)


def test_an_ask_not_answered_lately_is_built_afresh_and_the_kept_asks_are_bounded() -> None:
    world = World()
    for name in world.names:
        world.state.upsert_node(node(name, gpus=2, units=16))
    for mem in range(1, state_module.MAX_ASKS + 6):
        check(world, pod("asks", containers=[container(mem=mem, core=0)]), world.names)
    assert len(world.state._asks) == state_module.MAX_ASKS
    assert (1, 0) not in world.state._asks  # the least recent ask was let go
    world.state.delete_node("n0")
    check(world, pod("asks", containers=[container(mem=1, core=0)]), world.names)  # built afresh
    check(world, pod("asks", containers=[container(mem=2, core=0)]), world.names)  # brought up to date
