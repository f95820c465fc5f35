"""Placement scenarios on the real cluster (kube-scheduler with the extender, the kubelet's device manager, the
node daemons): fragmentation, Alibaba's and ACK's annotations, the multi-GPU label, init containers and sidecars,
whole GPUs, and the compute shares of containers on one GPU. Each ends with the kubelets' books audited against
the pods' records, and with what each container of each pod sees from inside (tests/realk8s/inside.py): its GPUs,
their memory, the shim and its limits, against what it asked for and what its node recorded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.realk8s import other_schedulers
from tests.realk8s.books import holdings
from tests.realk8s.cluster import Cluster
from tests.realk8s.gpu_shares import Spinner, measure
from tests.realk8s.inside import pod_sees_what_it_was_given
from tests.realk8s.podspecs import Ask, describe, on_node, pod, settled_and_recorded, unschedulable, wait_pods

pytestmark = pytest.mark.realk8s


def running(cluster: Cluster, ns: str, names: list[str], timeout: float = 60) -> dict[str, k8s.V1Pod]:
    pods = wait_pods(cluster.core, ns,
                     lambda ps: {p.metadata.name for p in ps if settled_and_recorded(p)} >= set(names),
                     f"{names} Running (with their record) or failed", timeout)
    by = {p.metadata.name: p for p in pods}
    bad = [describe(by[n]) for n in names if by[n].status.phase != "Running"]
    assert not bad, bad
    return by


def inside(cluster: Cluster, pods: list[k8s.V1Pod], unreserved: dict[str, dict[str, int]] | None = None) -> list[str]:
    """What each pod's containers see that they were not given (`unreserved`: pod -> container -> the cap of a
    container that reserved no compute, where the test knows it)."""
    return [bad for p in pods for bad in pod_sees_what_it_was_given(cluster, p, (unreserved or {}).get(
        p.metadata.name))]


def record(p: k8s.V1Pod) -> dict:
    return json.loads(p.metadata.annotations["gpushare.io/allocated"])


def held_by(cluster: Cluster, p: k8s.V1Pod, timeout: float = 10) -> dict[str, dict[str, int]]:
    """Container -> GPU index -> units of each kind, from the node agent's books (once every GPU container of the
    pod is there)."""
    node = cluster.node(p.spec.node_name)
    index = {g.uuid: g.index for g in node.driver.gpus}
    want = {c.name for c in (p.spec.init_containers or []) + p.spec.containers
            if c.resources and c.resources.limits}
    deadline = time.monotonic() + timeout
    while True:
        books = node.books()
        out: dict[str, dict[str, int]] = {}
        for h in holdings({node.name: books}):
            if h.uid == p.metadata.uid:
                for uuid, kinds in h.per_gpu().items():
                    out.setdefault(h.container, {})[f"{index[uuid]}"] = dict(+kinds)  # type: ignore[assignment]
        if set(out) >= want or time.monotonic() > deadline:
            assert set(out) >= want, f"the kubelet's books hold devices for {sorted(out)} of {sorted(want)}: {books}"
            return out
        time.sleep(0.2)


def test_fragmented_node_does_not_take_a_pod_larger_than_any_gpu_has_free(realk8s: Cluster, ns: str) -> None:
    frag = realk8s.nodes[0].name
    fill = [on_node(pod(f"fill-{g}", [Ask(mem=70, core=5)]), frag) for g in range(8)]
    whole = [pod(f"whole-{i}", [Ask(count=8)]) for i in range(len(realk8s.nodes) - 1)]
    for body in fill + whole:  # one at a time: a burst of same-sized pods is defect 0's (test_burst.py beside this)
        realk8s.core.create_namespaced_pod(ns, body)
        running(realk8s, ns, [body["metadata"]["name"]])
    by = running(realk8s, ns, [b["metadata"]["name"] for b in fill + whole])
    assert len({record(by[f"fill-{g}"])["containers"]["c0"][0]["index"] for g in range(8)}) == 8
    assert {by[f"whole-{i}"].spec.node_name for i in range(len(whole))} == {n.name for n in realk8s.nodes[1:]}
    # 80 GiB free on the fragmented node in total, 10 on each GPU: a 20 GiB pod must not be bound there
    realk8s.core.create_namespaced_pod(ns, pod("twenty", [Ask(mem=20, core=10)]))
    twenty = _wait_unschedulable(realk8s, ns, "twenty")
    assert twenty.spec.node_name is None
    assert "at most 10 GiB free on one GPU, 20 GiB asked" in unschedulable(twenty), unschedulable(twenty)
    # 10 GiB fits each GPU there
    realk8s.core.create_namespaced_pod(ns, pod("ten", [Ask(mem=10, core=10)]))
    assert running(realk8s, ns, ["ten"])["ten"].spec.node_name == frag
    assert realk8s.core.read_namespaced_pod("twenty", ns).spec.node_name is None
    assert realk8s.audit() == []
    placed = [b["metadata"]["name"] for b in fill + whole] + ["ten"]
    assert inside(realk8s, [p for name, p in running(realk8s, ns, placed).items() if name in placed]) == []


def _wait_unschedulable(cluster: Cluster, ns: str, name: str, timeout: float = 30) -> k8s.V1Pod:
    deadline = time.monotonic() + timeout
    while True:
        p = cluster.core.read_namespaced_pod(name, ns)
        if unschedulable(p) or p.spec.node_name or time.monotonic() > deadline:
            return p
        time.sleep(0.2)


def _placed_by(cluster: Cluster, ns: str, body: dict, scheduler: k8s.CoreV1Api, node: str,
               choice: dict[str, str]) -> k8s.V1Pod:
    """Create the pod (as its owner would: no choice annotations) for the other scheduler, which writes its choice
    and binds it to `node` as it does at bind; the pod once Running."""
    body["spec"]["schedulerName"] = other_schedulers.SCHEDULER_NAME
    cluster.core.create_namespaced_pod(ns, body)
    other_schedulers.bind_with_choice(scheduler, ns, body["metadata"]["name"], node, choice)
    return running(cluster, ns, [body["metadata"]["name"]])[body["metadata"]["name"]]


def test_alibaba_gpu_index_annotation_is_honoured(realk8s: Cluster, ns: str, tmp_path: Path) -> None:
    assert realk8s.pki is not None
    extender = other_schedulers.alibaba_extender(realk8s.api_client, realk8s.admin, realk8s.server,
                                                 realk8s.pki.ca.cert, tmp_path / "alibaba.kubeconfig")
    p = _placed_by(realk8s, ns, pod("aliyun", [Ask(mem=12)]), extender, realk8s.nodes[1].name, {
        "ALIYUN_COM_GPU_MEM_IDX": "3", "ALIYUN_COM_GPU_MEM_POD": "12", "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
        "ALIYUN_COM_GPU_MEM_ASSUME_TIME": str(time.time_ns())})
    assert [s["index"] for s in record(p)["containers"]["c0"]] == [3]
    assert held_by(realk8s, p) == {"c0": {"3": {"m": 12}}}
    assert _annotation(realk8s, p, "ALIYUN_COM_GPU_MEM_ASSIGNED") == "true"
    assert realk8s.audit() == []
    # gpu-mem alone on a core_mem node, on a GPU nobody had reserved compute on: it may take all of it
    assert inside(realk8s, [p], {"aliyun": {"c0": 100}}) == []


def test_ack_allocation_annotations_are_honoured_per_container(realk8s: Cluster, ns: str) -> None:
    assert realk8s.pki is not None
    scheduler = other_schedulers.kube_scheduler(realk8s.api_client, realk8s.pki.dir / "kube-scheduler.kubeconfig")
    body = pod("ack", [Ask(mem=12, core=30), Ask(mem=8, core=20)])
    p = _placed_by(realk8s, ns, body, scheduler, realk8s.nodes[2].name, {
        "scheduler.framework.gpushare.allocation": json.dumps({"0": {"5": 12}, "1": {"6": 8}}),
        "gpushare.alibabacloud.com/core-percentage": json.dumps({"0": {"5": 30}, "1": {"6": 20}}),
        "scheduler.framework.gpushare.assigned": "false",
        "scheduler.framework.gpushare.assume-time": str(time.time_ns())})
    assert held_by(realk8s, p) == {"c0": {"5": {"m": 12, "c": 30}}, "c1": {"6": {"m": 8, "c": 20}}}
    assert _annotation(realk8s, p, "scheduler.framework.gpushare.assigned") == "true"
    assert realk8s.audit() == []
    assert inside(realk8s, [p]) == []


def _annotation(cluster: Cluster, p: k8s.V1Pod, key: str, timeout: float = 10) -> str:
    """The pod's annotation `key` once the node daemon has marked the choice as placed (its record is written
    first)."""
    deadline = time.monotonic() + timeout
    while True:
        value = (cluster.core.read_namespaced_pod(p.metadata.name, p.metadata.namespace).metadata.annotations
                 or {}).get(key, "")
        if value == "true" or time.monotonic() > deadline:
            return str(value)
        time.sleep(0.2)


def test_multi_gpu_label_splits_each_container_evenly(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, pod("multi", [Ask(mem=40, core=60)], labels={"aliyun.com/gpu-count": "2"}))
    p = running(realk8s, ns, ["multi"])["multi"]
    held = held_by(realk8s, p)["c0"]
    assert len(held) == 2 and all(k == {"m": 20, "c": 30} for k in held.values()), held
    assert sorted(held) == sorted(str(s["index"]) for s in record(p)["containers"]["c0"])
    assert realk8s.audit() == []
    assert inside(realk8s, [p]) == []


def test_init_container_devices_are_reused_by_the_app_container(realk8s: Cluster, ns: str) -> None:
    body = pod("init", [Ask(mem=8, core=20, name="setup", init=True), Ask(mem=8, core=20, name="main")])
    realk8s.core.create_namespaced_pod(ns, body)
    p = running(realk8s, ns, ["init"])["init"]
    held = held_by(realk8s, p)
    # the kubelet hands the init container's devices on to the app container that asks the same
    assert held["main"] == held["setup"] and list(held["main"].values()) == [{"m": 8, "c": 20}], held
    rec = record(p)["containers"]
    assert rec["main"][0]["index"] == rec["setup"][0]["index"]
    assert realk8s.audit() == []
    assert inside(realk8s, [p]) == []  # the init container's view too, printed before it ended


def test_sidecar_holds_its_own_devices_beside_the_app_container(realk8s: Cluster, ns: str) -> None:
    body = pod("sidecar", [Ask(mem=4, core=10, name="proxy", sidecar=True), Ask(mem=8, core=20, name="main")])
    realk8s.core.create_namespaced_pod(ns, body)
    p = running(realk8s, ns, ["sidecar"])["sidecar"]
    held = held_by(realk8s, p)
    assert list(held["proxy"].values()) == [{"m": 4, "c": 10}], held
    assert list(held["main"].values()) == [{"m": 8, "c": 20}], held
    assert realk8s.audit() == []
    assert inside(realk8s, [p]) == []


def test_sidecar_after_a_gpu_init_container_reuses_its_devices(realk8s: Cluster, ns: str) -> None:
    body = pod("init-sidecar", [Ask(mem=8, core=20, name="setup", init=True),
                                Ask(mem=4, core=10, name="proxy", sidecar=True), Ask(mem=8, core=20, name="main")])
    realk8s.core.create_namespaced_pod(ns, body)
    p = running(realk8s, ns, ["init-sidecar"])["init-sidecar"]
    held = held_by(realk8s, p)
    assert list(held["proxy"].values()) == [{"m": 4, "c": 10}], held
    assert list(held["main"].values()) == [{"m": 8, "c": 20}], held
    assert realk8s.audit() == []
    assert inside(realk8s, [p]) == []


def test_whole_gpus_are_held_whole(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, pod("whole", [Ask(count=2)]))
    p = running(realk8s, ns, ["whole"])["whole"]
    held = held_by(realk8s, p)["c0"]
    assert len(held) == 2 and all(k == {"g": 1} for k in held.values()), held
    shares = record(p)["containers"]["c0"]
    assert all(s.get("whole") for s in shares) and sorted(str(s["index"]) for s in shares) == sorted(held)
    assert realk8s.audit() == []
    assert inside(realk8s, [p]) == []


def test_containers_sharing_a_gpu_each_get_their_compute_share(realk8s: Cluster, ns: str) -> None:
    """Containers on one GPU run kernels back to back at the same time, each under the shim its node gave it; the
    GPU time each got, read from the fake GPU's shared timeline: 30 / 30 / 40 % shares each within 5 points of its
    own, and a 70 % container keeps at least 65 % beside a container that reserved no compute (gpu-mem alone: it
    may take only what nobody reserved, and only what its neighbours leave: docs/guide/modes.md)."""
    realk8s.core.create_namespaced_pod(ns, pod("thirds", [Ask(mem=2, core=30), Ask(mem=2, core=30),
                                                          Ask(mem=2, core=40)]))
    realk8s.core.create_namespaced_pod(ns, pod("beside", [Ask(mem=2, core=70), Ask(mem=2)]))
    by = running(realk8s, ns, ["thirds", "beside"])
    spinners = []
    for p in by.values():
        rec = record(p)["containers"]
        assert len({s["index"] for c in rec.values() for s in c}) == 1, f"{p.metadata.name}: not on one GPU: {rec}"
        spinners += [Spinner(ns, p.metadata.name, c, p.spec.node_name, s[0]["index"]) for c, s in sorted(rec.items())]
    # placed after the 70 % container on its GPU, the memory-only one may take the 30 % nobody reserved
    assert inside(realk8s, list(by.values()), {"beside": {"c1": 30}}) == []
    got = measure(realk8s, spinners)
    print(f"compute shares on the GPUs' timeline: {got.per_container}, GPUs busy {got.per_gpu} "
          f"({got.windows} window(s))")
    share = got.per_container
    for c, want in (("c0", 30), ("c1", 30), ("c2", 40)):
        assert abs(share[f"thirds/{c}"] - want) <= 5, share
    assert share["beside/c0"] >= 65, share
    assert share["beside/c1"] > 0.5, share  # it still runs, on what the 70 % container leaves
