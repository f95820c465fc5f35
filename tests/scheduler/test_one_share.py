"""The indexed answers (devplugin/scheduler/one_share.py, the state's per-node ShareIndex and recount of evicted
pods, the preemption body read without models) are the answers the extender gave before them, on random
clusters: every node passed, failed or unresolvable alike with the same words, the same scores, the same JSON
bytes for prioritize, the same preemption plans kept, for pods of one share and pods of any other shape."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devplugin.contract import ANN_ALLOCATED, ANN_NODE_GPUS, ANN_SCHEDULED, GpuShare, GpuUsage, PodAssignment
from devplugin.scheduler import extender, http
from devplugin.scheduler.models import (
    ExtenderArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    NodeListObject,
)
from devplugin.scheduler.state import ClusterState
from tests.scheduler.answers_before import filter_before, preempt_before, prioritize_before
from tests.support.scheduler_objects import container, node, pod

USAGE_TIME = 50  # records at 10 are in the usage, records at 100 are not yet
SIZES = (8, 15, 16, 24)


@st.composite
def gpu_usage(draw: Any, size: int) -> GpuUsage:
    whole = draw(st.integers(0, 6)) == 0
    if whole:
        return GpuUsage(mem=size, core=100, containers=1, whole=True)
    return GpuUsage(mem=draw(st.integers(0, size + 2)), core=draw(st.sampled_from((0, 5, 30, 60, 100, 105))),
                    containers=draw(st.integers(0, 3)))


@st.composite
def held_pod(draw: Any, node_name: str, gpus: int, n: int) -> dict:
    """A pod on the node with its GPUs named by the daemon's record or the extender's choice."""
    index = draw(st.integers(0, gpus))  # gpus: a GPU the node does not have
    name = f"{node_name}-p{n}"
    if draw(st.integers(0, 5)) == 0:
        share, asks = GpuShare(index, "", 16, 100, whole=True), {"count": 1}
    else:
        mem, core = draw(st.integers(1, 16)), draw(st.sampled_from((0, 0, 5, 10, 25, 50, 75)))
        share, asks = GpuShare(index, "", mem, core), {"mem": mem, "core": core}
    record = PodAssignment(node_name, draw(st.sampled_from((10, 100))), {"main": (share,)}).render()
    annotation = draw(st.sampled_from((ANN_ALLOCATED, ANN_ALLOCATED, ANN_SCHEDULED)))
    return pod(name, node_name=node_name, annotations={annotation: record},
               phase=draw(st.sampled_from(("Running", "Pending"))), **asks)


def _counted(pods: list[dict], gpus: int) -> dict[int, GpuUsage]:
    """The usage a node daemon publishes for the pods whose record it wrote before it (time 10)."""
    usage: dict[int, GpuUsage] = {}
    for p in pods:
        record = p["metadata"]["annotations"].get(ANN_ALLOCATED, "")
        doc = json.loads(record) if record else {}
        if doc.get("time") != 10:
            continue
        for share in doc["containers"]["main"]:
            if share["index"] < gpus:
                u = usage.get(share["index"], GpuUsage())
                whole = share.get("whole", False)  # counted as the extender counts it: no amounts, the GPU whole
                usage[share["index"]] = GpuUsage(u.mem + (0 if whole else share["mem"]),
                                                 u.core + (0 if whole else share["core"]), u.containers + 1,
                                                 u.whole or whole)
    return usage


@st.composite
def clusters(draw: Any) -> tuple[ClusterState, list[dict], list[dict]]:
    nodes, pods = [], []
    for i in range(draw(st.integers(1, 5))):
        name = f"n{i}"
        gpus = draw(st.integers(1, 4))
        sizes = [draw(st.sampled_from(SIZES)) for _ in range(gpus)]
        mine = [draw(held_pod(name, gpus, n)) for n in range(draw(st.integers(0, 6)))]
        usage = draw(st.sampled_from(("daemon", "daemon", "random", "none")))
        counts: dict[int, GpuUsage] | None = None
        if usage == "daemon":
            counts = _counted(mine, gpus)
        elif usage == "random":
            counts = {g: draw(gpu_usage(sizes[g])) for g in draw(st.sets(st.integers(0, gpus - 1)))}
        obj = node(name, gpus=gpus, sizes=sizes, mode=draw(st.sampled_from(("core_mem", "core_mem", "cgpu", "share"))),
                   placement=draw(st.sampled_from(("binpack", "spread", None))),
                   unhealthy=tuple(draw(st.sets(st.integers(0, gpus - 1), max_size=1))), usage=counts,
                   usage_time_ns=USAGE_TIME)
        if draw(st.integers(0, 7)) == 0:
            del obj["metadata"]["annotations"][ANN_NODE_GPUS]  # no daemon: the node takes no GPU pod
        nodes.append(obj)
        pods += mine
    state = ClusterState()
    state.replace_nodes(nodes)
    state.replace_pods(pods)
    return state, nodes, pods


@st.composite
def full_clusters(draw: Any) -> tuple[ClusterState, list[dict], list[dict]]:
    """Nodes of 16-unit GPUs filled by pods, most of them counted in the daemon's usage (which may also be off by a
    little either way): where a big share fits only once some pods are evicted."""
    nodes, pods = [], []
    for i in range(draw(st.integers(1, 3))):
        name, gpus = f"n{i}", draw(st.integers(1, 3))
        mine = [draw(held_pod(name, gpus, n)) for n in range(draw(st.integers(1, 3 * gpus)))]
        counts = _counted(mine, gpus) if draw(st.integers(0, 3)) else None
        for g, u in list((counts or {}).items()):
            if draw(st.booleans()):
                counts[g] = GpuUsage(max(u.mem + draw(st.sampled_from((-10, -4, 2))), 0), max(u.core + draw(
                    st.sampled_from((-60, -20, 10))), 0), max(u.containers + draw(st.integers(-1, 1)), 0), u.whole)
        nodes.append(node(name, gpus=gpus, units=16, mode=draw(st.sampled_from(("core_mem",) * 5 + ("cgpu",))),
                          unhealthy=tuple(draw(st.sets(st.integers(0, gpus - 1), max_size=1))) if not i else (),
                          usage=counts, usage_time_ns=USAGE_TIME))
        pods += mine
    state = ClusterState()
    state.replace_nodes(nodes)
    state.replace_pods(pods)
    return state, nodes, pods


one_share_pods = st.builds(lambda mem, core: pod("asks", containers=[container(mem=mem, core=core)]),
                           st.integers(1, 26), st.sampled_from((0, 0, 5, 20, 50, 95, 100)))
other_pods = st.one_of(
    st.builds(lambda n: pod("asks", count=n), st.integers(1, 3)),
    st.builds(lambda a, b: pod("asks", containers=[container("a", mem=a, core=10), container("b", mem=b)]),
              st.integers(1, 16), st.integers(1, 16)),
    st.builds(lambda m: pod("asks", mem=m, labels={"aliyun.com/gpu-count": "2"}), st.sampled_from((2, 4, 6, 30))),
    st.just(pod("asks", containers=[container(core=20)])),  # a problem whatever the node
    st.just(pod("asks")),  # no GPU
)


# a share that fits only where evictions free most of a GPU
big_share_pods = st.builds(lambda mem, core: pod("asks", containers=[container(mem=mem, core=core)]),
                           st.integers(4, 16), st.sampled_from((0, 0, 50, 80, 100)))


def _asking(draw: Any, pods: list[dict]) -> dict:
    """The pod that asks: new, or one already placed (filtered again: its own holding left out)."""
    if pods and draw(st.integers(0, 4)) == 0:
        placed = draw(st.sampled_from(pods))
        asks = draw(one_share_pods)
        asks["metadata"]["uid"] = placed["metadata"]["uid"]
        return asks
    return draw(st.one_of(one_share_pods, one_share_pods, other_pods))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_filter_and_prioritize_answer_as_before(data: Any) -> None:
    state, nodes, pods = data.draw(clusters())
    asks = _asking(data.draw, pods)
    names = [n["metadata"]["name"] for n in nodes] + ["ghost"]
    names = data.draw(st.permutations(names))
    objects = None
    if data.draw(st.integers(0, 4)) == 0:  # cluster-autoscaler's shape: Node objects, one the watch never saw
        template = node("template", gpus=2, units=16)
        objects, names = [nodes[0], template], names[:2]
    before = filter_before(state, asks, names, objects), prioritize_before(state, asks, names, objects)
    out = extender.filter_nodes(state, asks, names, objects)
    assert (out.passed, out.failed, out.unresolvable) == before[0]
    assert extender.prioritize(state, asks, names, objects) == before[1]
    assert extender.prioritize_json(state, asks, names, objects) == json.dumps(
        [{"Host": h, "Score": s} for h, s in before[1]])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_preemption_keeps_the_plans_it_kept_before(data: Any) -> None:
    state, nodes, pods = data.draw(full_clusters() if data.draw(st.integers(0, 3)) else clusters())
    asks = data.draw(big_share_pods) if data.draw(st.integers(0, 2)) else _asking(data.draw, pods)
    uids = [p["metadata"]["uid"] for p in pods] + ["uid-unknown"]
    names = [n["metadata"]["name"] for n in nodes] + ["ghost"]
    victims = {}
    for name in data.draw(st.sets(st.sampled_from(names), min_size=1)):
        own = [p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName") == name]
        victims[name] = data.draw(st.just(own) | st.lists(st.sampled_from(own or uids), max_size=4)
                                  | st.lists(st.sampled_from(uids), max_size=3))
    assert extender.preempt(state, asks, victims) == preempt_before(state, asks, victims)


def _preempt_with_models(svc: http.Service, body: bytes) -> Any:
    """preempt_endpoint as it answered before the body was read without models."""
    args = http._parse(ExtenderPreemptionArgs, body)
    victims: dict[str, list[str]] = {}
    pdb: dict[str, int] = {}
    for name, meta in (args.NodeNameToMetaVictims or {}).items():
        victims[name], pdb[name] = [p.UID for p in meta.Pods], meta.NumPDBViolations
    for name, full in (args.NodeNameToVictims or {}).items():
        victims[name], pdb[name] = [p.metadata.uid for p in full.Pods], full.NumPDBViolations
    kept = extender.preempt(svc.state, http._pod_dict(args.Pod), victims)
    return json.loads(ExtenderPreemptionResult(NodeNameToMetaVictims={
        n: MetaVictims(Pods=[MetaPod(UID=u) for u in uids], NumPDBViolations=pdb[n])
        for n, uids in kept.items()}).model_dump_json())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_preemption_body_read_without_models_answers_as_the_models(data: Any) -> None:
    state, nodes, pods = data.draw(clusters())
    asks = data.draw(st.one_of(one_share_pods, other_pods))
    uids = [p["metadata"]["uid"] for p in pods] + ["uid-unknown"]
    names = [n["metadata"]["name"] for n in nodes]
    metas: dict[str, Any] = {}
    for name in data.draw(st.sets(st.sampled_from(names), min_size=1)):
        meta: dict[str, Any] = {"Pods": [{"UID": u} for u in data.draw(st.lists(st.sampled_from(uids), max_size=3))],
                                "NumPDBViolations": data.draw(st.integers(0, 3))}
        shape = data.draw(st.integers(0, 7))
        if shape == 1:
            del meta["NumPDBViolations"]
        elif shape == 2:
            del meta["Pods"]
        elif shape == 3:
            meta["pods"] = meta.pop("Pods")  # Go's decoder takes either case; the models do too
        elif shape == 4:
            meta["NumPDBViolations"] = "2"  # a string the models read as a number
        elif shape == 5:
            meta["Pods"].append({"UID": "u", "extra": 1})
        metas[name] = meta
    doc: dict[str, Any] = {"Pod": asks, "NodeNameToMetaVictims": metas}
    if data.draw(st.integers(0, 5)) == 0:
        doc["NodeNameToVictims"] = {names[0]: {"Pods": [pods[0] if pods else asks], "NumPDBViolations": 1}}
    body = json.dumps(doc).encode()
    svc = http.Service(state, None)
    answer = http.preempt_endpoint(svc, body)
    assert answer.status_code == 200
    assert json.loads(bytes(answer.body)) == _preempt_with_models(svc, body)


def _names_call_with_models(svc: http.Service, verb: str, body: bytes) -> Any:
    """filter_endpoint and prioritize_endpoint as they answered before the body was read without models."""
    args = http._parse(ExtenderArgs, body)
    if verb == "prioritize":
        return [{"Host": h, "Score": v} for h, v in extender.prioritize(
            svc.state, http._pod_dict(args.Pod), args.NodeNames, http._nodes(args))]
    out = extender.filter_nodes(svc.state, http._pod_dict(args.Pod), args.NodeNames, http._nodes(args))
    result = ExtenderFilterResult(NodeNames=out.passed, FailedNodes=out.failed,
                                  FailedAndUnresolvableNodes=out.unresolvable)
    if args.Nodes is not None:
        keep = set(out.passed)
        result.Nodes = NodeListObject(items=[n for n in args.Nodes.items if n.metadata.name in keep])
        if args.NodeNames is None:
            result.NodeNames = None
    return json.loads(result.model_dump_json(by_alias=True, exclude_none=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_filter_and_prioritize_bodies_read_without_models_answer_as_the_models(data: Any) -> None:
    state, nodes, pods = data.draw(clusters())
    asks = _asking(data.draw, pods)
    names = data.draw(st.lists(st.sampled_from([n["metadata"]["name"] for n in nodes] + ["ghost", "n\u00e9"]),
                               max_size=8))
    doc: dict[str, Any] = {"Pod": asks, "NodeNames": names}
    shape = data.draw(st.integers(0, 6))
    if shape == 1:
        doc["nodeNames"] = doc.pop("NodeNames")  # Go's decoder takes either case; the models do too
    elif shape == 2:
        doc["Nodes"] = {"items": nodes[:1]}  # cluster-autoscaler's shape
    elif shape == 3:
        doc["extra"] = 1  # a key the models ignore
    elif shape == 4:
        del doc["NodeNames"]
    body = json.dumps(doc).encode()
    for verb, endpoint in (("filter", http.filter_endpoint), ("prioritize", http.prioritize_endpoint)):
        svc = http.Service(state, None)
        answer = endpoint(svc, body)
        assert answer.status_code == 200
        assert json.loads(bytes(answer.body)) == _names_call_with_models(svc, verb, body), verb


def test_a_malformed_preemption_body_gets_the_models_error() -> None:
    svc = http.Service(ClusterState(), None)
    bad = {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"image": "x"}]}},
           "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u"}]}}}
    for body in (json.dumps(bad).encode(), b'{"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}}',
                 b'{"Pod": NaN}'):
        try:
            http.preempt_endpoint(svc, body)
        except http.BadRequest as exc:
            assert exc.reason.startswith("body is not a valid ExtenderPreemptionArgs"), exc.reason
        else:
            raise AssertionError(f"{body!r} was answered")


def test_evicting_pods_the_usage_undercounts_frees_no_more_than_the_usage() -> None:
    # The daemon's usage (4 GiB, 10 %) counts less than the record of the pod it names (8 GiB, 40 %): evicting
    # that pod frees what the usage counts, not below zero; the pod not in the usage yet (2 GiB, 60 %) stays.
    counted = pod("counted", mem=8, core=40, node_name="n1", phase="Running", annotations={
        ANN_ALLOCATED: PodAssignment("n1", 10, {"main": (GpuShare(0, "", 8, 40),)}).render()})
    new = pod("new", mem=2, core=60, node_name="n1", phase="Running", annotations={
        ANN_ALLOCATED: PodAssignment("n1", 100, {"main": (GpuShare(0, "", 2, 60),)}).render()})
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=1, units=16, usage={0: GpuUsage(mem=4, core=10, containers=1)},
                              usage_time_ns=USAGE_TIME)])
    state.replace_pods([counted, new])
    victims = {"n1": [counted["metadata"]["uid"]]}
    for mem, core, kept in ((14, 40, True), (15, 40, False), (14, 45, False)):  # 14 GiB and 40 % free after
        asks = pod("asks", containers=[container(mem=mem, core=core)])
        assert extender.preempt(state, asks, victims) == ({"n1": victims["n1"]} if kept else {})
        assert extender.preempt(state, asks, victims) == preempt_before(state, asks, victims)
