"""The extender honours a pod's choice of GPU models and UUIDs: filter, prioritize, preempt and bind use only the
GPUs the pod allows, and a node with none of them fails with the annotation and what the node has."""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplugin import contract as c
from devplugin.contract import ANN_NODE_GPUS, NodeGpu, NodeInventory
from devplugin.scheduler.extender import filter_nodes, preempt, prioritize
from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster
from tests.support.scheduler_objects import bind, container, node, pod

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def uuid(node_name: str, i: int) -> str:
    return f"GPU-{abs(hash(node_name)) % 16**8:08x}-0000-4000-8000-{i:012x}"


def mixed(name: str, models: list[str], units: int = 15, **kw: object) -> dict:
    """A node whose GPU i has model models[i] and UUID uuid(name, i)."""
    obj = node(name, gpus=len(models), units=units, **kw)  # type: ignore[arg-type]
    inv = NodeInventory(mode="core_mem", placement="binpack", mem_unit_mib=1024, gpus=tuple(
        NodeGpu(i, uuid(name, i), m, units, units * 1024) for i, m in enumerate(models)))
    obj["metadata"]["annotations"][ANN_NODE_GPUS] = inv.render()
    return obj


def cluster() -> ClusterState:
    st = ClusterState()
    st.replace_nodes([mixed("a100s", [A100, A100]), mixed("h100s", [H100, H100])])
    st.replace_pods([])
    return st


def test_a_model_choice_passes_only_the_nodes_that_have_it_and_says_what_the_others_have() -> None:
    st = cluster()
    out = filter_nodes(st, pod(mem=4, core=20, annotations={c.ANN_USE_GPU_MODEL: "h100"}), ["a100s", "h100s"])
    assert out.passed == ["h100s"]
    why = out.unresolvable["a100s"]
    assert "gpushare.io/use-gpu-model=h100" in why and f"GPUs 0,1 {A100!r}" in why
    assert uuid("a100s", 0) in why and uuid("a100s", 1) in why
    hami = filter_nodes(st, pod(mem=4, annotations={c.ANN_HAMI_NOUSE_GPU_TYPE: "H100"}), ["a100s", "h100s"])
    assert hami.passed == ["a100s"] and "nvidia.com/nouse-gputype=H100" in hami.unresolvable["h100s"]


def test_an_avoided_uuid_is_never_chosen_and_a_node_left_without_room_says_which_gpu_was_left_out() -> None:
    st = cluster()
    avoid = {c.ANN_AVOID_GPU_UUID: uuid("h100s", 0)}
    p = pod("first", mem=10, annotations=avoid)
    st.upsert_pod(p)
    assert filter_nodes(st, p, ["h100s"]).passed == ["h100s"]
    assignment = bind(st, FakeCluster(st), "default", "first", p["metadata"]["uid"], "h100s")
    assert [s.uuid for s in assignment.containers["main"]] == [uuid("h100s", 1)]  # binpack alone would take GPU 0
    st.upsert_pod({**p, "spec": {**p["spec"], "nodeName": "h100s"}, "metadata": {
        **p["metadata"], "annotations": {**avoid, c.ANN_SCHEDULED: assignment.render()}}})
    full = filter_nodes(st, pod("late", mem=10, annotations=avoid), ["h100s"])
    why = full.failed["h100s"]
    assert why.startswith("GPU 1: at most 5 GiB free") and f"GPU 0: named in {c.ANN_AVOID_GPU_UUID}" in why
    assert filter_nodes(st, pod("free", mem=10), ["h100s"]).passed == ["h100s"]  # GPU 0 has the room


def test_prioritize_scores_zero_where_the_selection_allows_nothing() -> None:
    st = cluster()
    scores = dict(prioritize(st, pod(mem=4, annotations={c.ANN_USE_GPU_MODEL: "A100"}), ["a100s", "h100s"]))
    assert scores["h100s"] == 0 and scores["a100s"] > 0


def test_a_malformed_selection_makes_every_node_unresolvable_with_the_reason() -> None:
    st = cluster()
    out = filter_nodes(st, pod(mem=4, annotations={c.ANN_USE_GPU_UUID: "MIG-abc"}), ["a100s", "h100s"])
    assert out.passed == [] and set(out.unresolvable) == {"a100s", "h100s"}
    assert all("MIG instance" in why for why in out.unresolvable.values())
    assert dict(prioritize(st, pod(mem=4, annotations={c.ANN_USE_GPU_UUID: "x"}), ["a100s"])) == {"a100s": 0}


def test_bind_places_on_an_allowed_gpu_even_where_binpack_prefers_another() -> None:
    st = ClusterState()
    st.replace_nodes([mixed("mix", [A100, H100, A100])])
    st.replace_pods([])
    p = pod(mem=2, annotations={c.ANN_USE_GPU_UUID: uuid("mix", 2)})
    st.upsert_pod(p)
    assignment = bind(st, FakeCluster(st), "default", "p", p["metadata"]["uid"], "mix")
    assert [s.index for s in assignment.containers["main"]] == [2]
    q = pod("q", containers=[container("a", mem=2), container("b", count=1)], annotations={
        c.ANN_USE_GPU_MODEL: "A100"})
    st.upsert_pod(q)
    got = bind(st, FakeCluster(st), "default", "q", q["metadata"]["uid"], "mix")
    assert {s.index for shares in got.containers.values() for s in shares} <= {0, 2}


def test_preempt_keeps_only_nodes_where_the_victims_free_an_allowed_gpu() -> None:
    st = ClusterState()
    st.replace_nodes([mixed("mix", [A100, H100])])
    held = []
    for i in range(2):
        share = c.GpuShare(i, uuid("mix", i), 15, 0)
        held.append(pod(f"old{i}", mem=15, node_name="mix", phase="Running", annotations={
            c.ANN_ALLOCATED: c.PodAssignment("mix", 1, {"main": (share,)}).render()}))
    st.replace_pods(held)
    victims = {h["metadata"]["uid"] for h in held}
    wants_h100 = pod("new", mem=15, annotations={c.ANN_USE_GPU_MODEL: "H100"})
    assert preempt(st, wants_h100, {"mix": [held[1]["metadata"]["uid"]]}) == {"mix": [held[1]["metadata"]["uid"]]}
    assert preempt(st, wants_h100, {"mix": [held[0]["metadata"]["uid"]]}) == {}
    assert preempt(st, pod("any", mem=15), {"mix": list(victims)}) == {"mix": list(victims)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([A100, H100, "Tesla V100-SXM2-16GB"]), min_size=1, max_size=6),
       st.lists(st.sampled_from(["a100", "H100", "v100", "SXM"]), min_size=1, max_size=2), st.booleans(),
       st.integers(1, 15))
def test_filter_and_bind_never_choose_an_excluded_gpu(models: list[str], entries: list[str], use: bool,
                                                       mem: int) -> None:
    state = ClusterState()
    state.replace_nodes([mixed("n", models)])
    state.replace_pods([])
    name = c.ANN_USE_GPU_MODEL if use else c.ANN_AVOID_GPU_MODEL
    allowed = {i for i, m in enumerate(models)
               if any(e.lower() in m.lower() for e in entries) == use}
    p = pod(mem=mem, annotations={name: ",".join(entries)})
    state.upsert_pod(p)
    out = filter_nodes(state, p, ["n"])
    assert (out.passed == ["n"]) == bool(allowed)
    if not allowed:
        assert name in out.unresolvable["n"]
        return
    got = bind(state, FakeCluster(state), "default", "p", p["metadata"]["uid"], "n")
    assert {s.index for s in got.containers["main"]} <= allowed


@pytest.mark.parametrize("body", ["names", "nodes"])
def test_the_http_filter_honours_the_selection(body: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    st = cluster()
    p = pod(mem=4, annotations={c.ANN_AVOID_GPU_MODEL: "A100"})
    args = ({"Pod": p, "NodeNames": ["a100s", "h100s"]} if body == "names" else
            {"Pod": p, "Nodes": {"items": [mixed("a100s", [A100, A100]), mixed("h100s", [H100, H100])]}})
    client = TestClient(build_app(Service(st, FakeCluster(st), max_body=64 * 1024)))
    answer = client.post("/scheduler/filter", content=json.dumps(args)).json()
    passed = answer.get("NodeNames") or [n["metadata"]["name"] for n in (answer.get("Nodes") or {}).get("items", [])]
    assert passed == ["h100s"]
    assert "avoid-gpu-model=A100" in answer["FailedAndUnresolvableNodes"]["a100s"]


def test_a_gpus_uuid_takes_its_mig_devices_along_and_a_profile_is_chosen_by_name() -> None:
    gpu = uuid("mig", 1)
    inv = NodeInventory(mode="core_mem", placement="binpack", mem_unit_mib=1024, gpus=(
        NodeGpu(0, uuid("mig", 0), A100, 80, 80 * 1024),
        NodeGpu(2, "MIG-aaaaaaaa-0000-4000-8000-000000000002", f"{A100} MIG 3g.40gb", 39, 39 * 1024,
                parent_uuid=gpu, parent_index=1, mig_profile="3g.40gb"),
        NodeGpu(3, "MIG-aaaaaaaa-0000-4000-8000-000000000003", f"{A100} MIG 1g.10gb", 9, 9 * 1024,
                parent_uuid=gpu, parent_index=1, mig_profile="1g.10gb")))
    obj = node("mig", gpus=3)
    obj["metadata"]["annotations"][ANN_NODE_GPUS] = inv.render()
    st = ClusterState()
    st.replace_nodes([obj])
    st.replace_pods([])

    def placed(annotations: dict[str, str], mem: int = 4) -> set[int]:
        p = pod(mem=mem, annotations=annotations)
        st.upsert_pod(p)
        got = bind(st, FakeCluster(st), "default", p["metadata"]["name"], p["metadata"]["uid"], "mig")
        st.forget(p["metadata"]["uid"])
        return {s.index for s in got.containers["main"]}

    assert placed({c.ANN_USE_GPU_UUID: gpu}) == {3}  # binpack among its MIG devices
    assert placed({c.ANN_AVOID_GPU_UUID: gpu}) == {0}
    assert placed({c.ANN_USE_GPU_MODEL: "MIG 3g.40gb"}) == {2}
    assert placed({c.ANN_AVOID_GPU_MODEL: "mig"}) == {0}
    out = filter_nodes(st, pod(mem=40, annotations={c.ANN_USE_GPU_UUID: gpu}), ["mig"])
    assert "excluded by the pod's GPU selection: GPU 0: not named in gpushare.io/use-gpu-uuid" in out.failed["mig"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([A100, H100]), min_size=1, max_size=4),
                          st.lists(st.integers(0, 15), min_size=4, max_size=4)), min_size=1, max_size=6),
       st.sampled_from([{c.ANN_USE_GPU_MODEL: "h100"}, {c.ANN_AVOID_GPU_MODEL: "A100"},
                        {c.ANN_AVOID_GPU_UUID: "GPU-00000000-0000-4000-8000-000000000001"},
                        {c.ANN_USE_GPU_MODEL: "nvidia", c.ANN_AVOID_GPU_MODEL: "sxm4"}]),
       st.integers(1, 15), st.sampled_from([0, 10, 50]))
def test_a_one_share_pods_answers_from_the_index_equal_fit_on_the_allowed_gpus(
        layouts: list[tuple[list[str], list[int]]], annotations: dict[str, str], mem: int, core: int) -> None:
    from devplugin.scheduler.extender import fit_selected
    from devplugin.scheduler.fit import ask_of, score
    from devplugin.scheduler.selected import narrow

    state = ClusterState()
    objs, held = [], []
    for n, (models, used) in enumerate(layouts):
        name = f"n{n}"
        objs.append(mixed(name, models))
        for i in range(len(models)):
            if used[i]:
                share = c.GpuShare(i, uuid(name, i), used[i], 0)
                held.append(pod(f"h{n}-{i}", mem=used[i], node_name=name, phase="Running", annotations={
                    c.ANN_ALLOCATED: c.PodAssignment(name, 1, {"main": (share,)}).render()}))
    state.replace_nodes(objs)
    state.replace_pods(held)
    names = [f"n{n}" for n in range(len(layouts))]
    p = pod("new", mem=mem, core=core, annotations=annotations)
    from devplugin.allocation.gpu_selection import read_selection
    from devplugin.allocation.requests import pod_request

    selection = read_selection(annotations)
    ask = ask_of(pod_request(p))
    out = filter_nodes(state, p, names)
    want_passed, want_failed, want_unresolvable = [], {}, {}
    want_scores = {}
    for name in names:
        view = state.view(name)
        assert view is not None
        result = fit_selected(ask, view, selection)
        if result.ok:
            want_passed.append(name)
        elif result.unresolvable:
            want_unresolvable[name] = result.reason
        else:
            want_failed[name] = result.reason
        narrowed = narrow(view, selection)
        want_scores[name] = 0 if isinstance(narrowed, str) else score(narrowed.view, fit_selected(ask, view, selection))
    assert sorted(out.passed) == sorted(want_passed)
    assert out.failed == want_failed and out.unresolvable == want_unresolvable
    assert dict(prioritize(state, p, names)) == want_scores


def test_what_a_selection_left_out_is_forgotten_when_the_node_republishes_its_gpus() -> None:
    st = ClusterState()
    st.replace_nodes([mixed("n", [A100, A100])])
    st.replace_pods([])
    wants = pod(mem=4, annotations={c.ANN_USE_GPU_MODEL: "H100"})
    assert "n" in filter_nodes(st, wants, ["n"]).unresolvable
    st.upsert_node(mixed("n", [A100, H100]))  # the daemon publishes its inventory again (a GPU replaced)
    assert filter_nodes(st, wants, ["n"]).passed == ["n"]
    assert dict(prioritize(st, wants, ["n"]))["n"] > 0
