"""Dynamic Resource Allocation end to end on the real components (tests/realk8s/dra_cluster.py): a pod's
ResourceClaimTemplate becomes a claim (kube-controller-manager), the claim is allocated a share of a device by
kube-scheduler against the node's ResourceSlice (structured parameters, consumable capacity), the node agent's
DRA manager (the kubelet's own, pkg/kubelet/cm/dra) prepares it through the driver's kubelet plugin, the
container gets the CDI devices the plugin named with the env and mounts of their specs, and when the pod goes the
claim is unprepared, deallocated and deleted."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.utils import parse_quantity

from tests.realk8s.cluster import node_gpus
from tests.realk8s.dra_cluster import DRIVER, MODE_DRA, MODE_LABEL, SHARE_CLASS, DraCluster, DraSpec, running_dra
from tests.realk8s.images import WORKLOAD_IMAGE
from tests.realk8s.inside import GiB, View, sees_slice

pytestmark = pytest.mark.realk8s

MIB = 1 << 20
CDI_KIND = "gpushare.io/gpu"


def claim_template(name: str, memory: str, cores: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": SHARE_CLASS, "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}}}


def pod_with_claim(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {MODE_LABEL: MODE_DRA},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "c0", "image": WORKLOAD_IMAGE,
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def running_pod(c: DraCluster, ns: str, name: str) -> k8s.V1Pod:
    def running() -> k8s.V1Pod | None:
        p = c.core.read_namespaced_pod(name, ns)
        assert p.status.phase != "Failed", (p.status.reason, p.status.message)
        return p if p.status.phase == "Running" else None

    pod: k8s.V1Pod = c.wait(running, f"pod {name} Running")
    return pod


def gone(read: Callable[[], Any]) -> bool:
    try:
        read()
    except k8s.ApiException as exc:
        return exc.status == 404
    return False


def test_template_claim_allocated_prepared_injected_then_freed(dra_cluster: DraCluster, dra_ns: str) -> None:
    c = dra_cluster
    c.create_resource("resourceclaimtemplates", claim_template("share", "2Gi", "30"), dra_ns)
    c.core.create_namespaced_pod(dra_ns, pod_with_claim("p", "share"))
    pod = running_pod(c, dra_ns, "p")
    uid, node = pod.metadata.uid, c.node(pod.spec.node_name)

    # kube-controller-manager generated the claim from the template; kube-scheduler allocated a share of one GPU
    statuses = pod.status.resource_claim_statuses or []
    assert [s.name for s in statuses] == ["gpu"] and statuses[0].resource_claim_name
    claim = c.resource("resourceclaims", dra_ns, statuses[0].resource_claim_name)
    claim_uid = claim["metadata"]["uid"]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == uid
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == node.name and result["request"] == "gpu"
    assert result["consumedCapacity"] == {"memory": "2Gi", "cores": "30"}
    assert result["shareID"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [uid]
    index = int(result["device"].removeprefix("gpu-"))
    gpu = node_gpus(node.name, c.spec.gpus, c.spec.gpu_mib)[index]

    # the node's DRA manager prepared it through `devplugin dra` and holds it for the pod
    (held,) = node.claims()
    assert held["uid"] == claim_uid and held["podUIDs"] == [uid]
    (dev,) = held["devices"]
    assert (dev["driver"], dev["pool"], dev["device"], dev["shareID"]) == (
        DRIVER, node.name, result["device"], result["shareID"])
    assert dev["requestNames"] == ["gpu"] and dev["cdiDeviceIDs"] == [f"{CDI_KIND}={claim_uid}-0"]

    # the container got that CDI device, resolved from the spec the plugin wrote: its env and the shim's mounts
    (bpod,) = [p for p in node.books()["pods"] if p["uid"] == uid]
    assert bpod["phase"] == "Running"
    (ctr,) = bpod["containers"]
    assert ctr["cdi"]["cdiDevices"] == dev["cdiDeviceIDs"]
    assert ctr["cdi"]["injected"]["specs"] == [str(node.cdi_dir / f"gpushare.io-gpu_{claim_uid}.json")]
    env = ctr["cdi"]["injected"]["env"]
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["ALIYUN_COM_GPU_MEM_IDX"]) == (gpu.uuid, str(index))
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (f"{2048}m", "30")
    assert {k: ctr["envs"][k] for k in env} == env  # what the container's environment holds
    mounts = {m["containerPath"]: m["hostPath"] for m in ctr["cdi"]["injected"]["mounts"]}
    limits = mounts["/etc/gpushare/limits"]
    assert f"claim-{claim_uid}-0" in limits and open(limits).read()

    # what the workload sees inside the container: exactly that GPU at 2 GiB in NVML, nvidia-smi and NVIDIA's
    # runtime, the shim preloaded at 30 % (the grant read by the toolkit from the spec's mount, not from the env)
    view = View(c.probe(dra_ns, "p", "c0"))
    assert sees_slice(view, [gpu.uuid], 2 * GiB, 30) == []
    fill = c.exec(dra_ns, "p", "c0", ["/opt/gpushare-test/rt_probe_static", "init", "fill", "256"])
    steps = [json.loads(line) for line in fill["stdout"].splitlines() if line.startswith("{")]
    (filled,) = [st for st in steps if st["op"] == "fill"]
    assert filled["error"] == "cudaErrorMemoryAllocation" and filled["count"] == 7, filled  # 7 x 256 MiB + context

    # the pod goes: the agent unprepares (the spec is gone), KCM deallocates and deletes the generated claim
    c.core.delete_namespaced_pod("p", dra_ns)
    c.wait(lambda: not node.claims(), "the claim unprepared on the node")
    assert not (node.cdi_dir / f"gpushare.io-gpu_{claim_uid}.json").exists()
    c.wait(lambda: gone(lambda: c.resource("resourceclaims", dra_ns, claim["metadata"]["name"])),
           "the generated claim deleted")


def test_claim_of_an_unregistered_driver_fails_the_pod_with_the_kubelets_message(dra_cluster: DraCluster,
                                                                                  dra_ns: str) -> None:
    """A claim allocated on a node where its driver never registered: the DRA manager's PrepareResources fails,
    and the pod fails with the kubelet's reason and message; the claim is then freed."""
    c = dra_cluster
    node = c.nodes[0]
    absent = f"absent-{dra_ns}.gpushare.io"
    selector = {"cel": {"expression": f'device.driver == "{absent}"'}}
    c.create_resource("deviceclasses", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                        "metadata": {"name": absent}, "spec": {"selectors": [selector]}})
    c.create_resource("resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node.name}-{absent}"},
        "spec": {"driver": absent, "nodeName": node.name,
                 "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "dev-0"}]}})
    try:
        c.create_resource("resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "orphan"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": absent}}]}}}, dra_ns)
        body = pod_with_claim("orphan", "unused")
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "orphan"}]
        c.core.create_namespaced_pod(dra_ns, body)

        def failed() -> k8s.V1Pod | None:
            p = c.core.read_namespaced_pod("orphan", dra_ns)
            return p if p.status.phase == "Failed" else None

        pod = c.wait(failed, "pod orphan Failed")
        assert pod.spec.node_name == node.name and pod.status.reason == "FailedPrepareDynamicResources"
        assert pod.status.message.startswith("Failed to prepare dynamic resources: ")
        assert absent in pod.status.message and "not registered" in pod.status.message, pod.status.message
        assert not node.claims()
        # the pod is done: kube-controller-manager drops its reservation and the allocation
        c.wait(lambda: not c.resource("resourceclaims", dra_ns, "orphan")["status"].get("allocation"),
               "the claim deallocated")
    finally:
        c.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", f"{node.name}-{absent}")
        c.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", absent)


def test_restarted_node_agent_keeps_the_prepared_claim_from_its_checkpoint(dra_cluster: DraCluster,
                                                                           dra_ns: str) -> None:
    """The DRA manager's checkpoint outlives the node agent: restarted, it adopts the Running pod with the claim
    held for it and the same CDI device and env, and unprepares it when the pod goes. (Kubernetes 1.36.3's DRA
    manager reads its checkpoint back as not prepared, asks the driver again, which must answer the same, and
    appends that answer to the devices it held: each device is then listed twice.)"""
    c = dra_cluster
    c.create_resource("resourceclaimtemplates", claim_template("share", "1Gi", "10"), dra_ns)
    c.core.create_namespaced_pod(dra_ns, pod_with_claim("r", "share"))
    pod = running_pod(c, dra_ns, "r")
    uid, node = pod.metadata.uid, c.node(pod.spec.node_name)
    before = node.claims()
    (ctr_before,) = next(p for p in node.books()["pods"] if p["uid"] == uid)["containers"]

    node.agent.restart(timeout=60)
    c.wait(lambda: any(p["uid"] == uid and p["phase"] == "Running" for p in node.books()["pods"]),
           "the pod adopted by the restarted agent")
    (held,) = node.claims()
    assert {k: held[k] for k in ("uid", "name", "podUIDs")} == {k: before[0][k] for k in ("uid", "name", "podUIDs")}
    assert held["devices"] == before[0]["devices"] * 2  # the driver's same answer, appended
    (ctr_after,) = next(p for p in node.books()["pods"] if p["uid"] == uid)["containers"]
    assert ctr_after["cdi"]["cdiDevices"] == ctr_before["cdi"]["cdiDevices"] * 2
    assert ctr_after["cdi"]["injected"] == ctr_before["cdi"]["injected"] and ctr_after["envs"] == ctr_before["envs"]
    assert c.core.read_namespaced_pod("r", dra_ns).status.phase == "Running"

    c.core.delete_namespaced_pod("r", dra_ns)
    c.wait(lambda: not node.claims(), "the claim unprepared after the restart")
    claim_uid = before[0]["uid"]
    assert not (node.cdi_dir / f"gpushare.io-gpu_{claim_uid}.json").exists()
    # the restarted DRA manager deleted the node's slices, as the kubelet does; the plugin publishes them again
    c.wait_plugin(node, timeout=90)


def test_kubeletplugin_stub_serves_the_same_chain() -> None:
    """The same chain with e2e/bin/stubdra (Kubernetes' kubeletplugin helper) as the node's plugin: the node agent
    works with upstream's own plugin code, not only with `devplugin dra`."""
    with running_dra(DraSpec(nodes=1, gpus=1, plugin="stub")) as c:
        ns = c.namespace()
        c.create_resource("resourceclaimtemplates", claim_template("share", "3Gi", "25"), ns)
        c.core.create_namespaced_pod(ns, pod_with_claim("s", "share"))
        pod = running_pod(c, ns, "s")
        node = c.nodes[0]
        (bpod,) = [p for p in node.books()["pods"] if p["uid"] == pod.metadata.uid]
        env = bpod["containers"][0]["cdi"]["injected"]["env"]
        assert (env["GPUSHARE_DRA_DEVICE"], env["GPUSHARE_DRA_MEMORY"], env["GPUSHARE_DRA_CORES"]) == (
            "gpu-0", str(3 << 30), "25")
        c.core.delete_namespaced_pod("s", ns)
        c.wait(lambda: not node.claims(), "the claim unprepared")
        assert not list(node.cdi_dir.glob("*.json"))


def test_shares_pack_three_per_gpu_by_compute_and_the_next_stays_pending(dra_cluster: DraCluster,
                                                                         dra_ns: str) -> None:
    """2Gi / 30 cores claims: three fit a 16 GiB GPU by compute (90 of 100 cores), so the cluster's 4 GPUs take 12
    and the 13th pod stays Pending with the scheduler's reason; every GPU's allocations add up within its
    ResourceSlice capacities, and each node's DRA manager holds exactly the claims of its pods, prepared."""
    c = dra_cluster
    gpus = c.spec.nodes * c.spec.gpus
    c.create_resource("resourceclaimtemplates", claim_template("share", "2Gi", "30"), dra_ns)
    names = [f"p{i}" for i in range(3 * gpus + 1)]
    for name in names:
        c.core.create_namespaced_pod(dra_ns, pod_with_claim(name, "share"))

    def settled() -> tuple[list[k8s.V1Pod], list[k8s.V1Pod]] | None:
        pods = c.core.list_namespaced_pod(dra_ns).items
        assert not [p.metadata.name for p in pods if p.status.phase == "Failed"]
        run = [p for p in pods if p.status.phase == "Running"]
        pending = [p for p in pods if p.status.phase == "Pending" and any(
            cond.type == "PodScheduled" and cond.status == "False" for cond in (p.status.conditions or []))]
        return (run, pending) if len(run) == 3 * gpus and len(pending) == 1 else None

    run, (pending,) = c.wait(settled, f"{3 * gpus} pods Running and one unschedulable", timeout=120)
    (cond,) = [x for x in pending.status.conditions if x.type == "PodScheduled"]
    assert "cannot allocate all claims" in cond.message, cond.message

    # per GPU, what the allocations consumed, within what its slice offers
    offered = {(sl["spec"]["pool"]["name"], d["name"]): {k: parse_quantity(q["value"])
                                                         for k, q in d["capacity"].items()}
               for node in c.nodes for sl in c.slices(node.name) for d in sl["spec"].get("devices", [])
               if "capacity" in d}
    used: dict[tuple[str, str], dict[str, int]] = {}
    for claim in c.resource("resourceclaims", dra_ns):
        for r in (claim["status"].get("allocation") or {}).get("devices", {}).get("results", []):
            u = used.setdefault((r["pool"], r["device"]), {"memory": 0, "cores": 0})
            for k in u:
                u[k] += int(parse_quantity(r["consumedCapacity"][k]))
    assert len(used) == gpus and all(u == {"memory": 6 << 30, "cores": 90} for u in used.values()), used
    assert all(u[k] <= offered[dev][k] for dev, u in used.items() for k in u), (used, offered)
    for node in c.nodes:
        on_node = {p.metadata.uid for p in run if p.spec.node_name == node.name}
        held = node.claims()
        assert sorted(u for h in held for u in h["podUIDs"]) == sorted(on_node)
        assert len({(d["device"], d["shareID"]) for h in held for d in h["devices"]}) == len(on_node)


def test_plugin_sigkilled_and_restarted_loses_nothing(dra_cluster: DraCluster, dra_ns: str) -> None:
    """`devplugin dra` SIGKILLed with claims prepared and started again: the node's DRA manager still holds them,
    the plugin re-registers through the plugin watcher, the claims prepared before the kill are unprepared through
    the new process (spec files gone), and new claims are prepared by it."""
    c = dra_cluster
    node = c.nodes[0]
    c.create_resource("resourceclaimtemplates", claim_template("share", "1Gi", "20"), dra_ns)
    pin = {"kubernetes.io/hostname": node.name}  # through the scheduler: it allocates the claims
    for name in ("a", "b"):
        body = pod_with_claim(name, "share")
        body["spec"]["nodeSelector"].update(pin)
        c.core.create_namespaced_pod(dra_ns, body)
    uids = {running_pod(c, dra_ns, n).metadata.uid for n in ("a", "b")}
    held = node.claims()
    assert {u for h in held for u in h["podUIDs"]} == uids
    specs = {h["uid"]: node.cdi_dir / f"gpushare.io-gpu_{h['uid']}.json" for h in held}
    assert all(p.exists() for p in specs.values())

    node.plugin.kill()
    node.plugin.start()
    c.wait_plugin(node)
    assert node.claims() == held

    body = pod_with_claim("after", "share")
    body["spec"]["nodeSelector"].update(pin)
    c.core.create_namespaced_pod(dra_ns, body)
    after = running_pod(c, dra_ns, "after")
    (bpod,) = [p for p in node.books()["pods"] if p["uid"] == after.metadata.uid]
    assert bpod["containers"][0]["cdi"]["injected"]["env"]["CUDA_DEVICE_SM_LIMIT"] == "20"

    for name in ("a", "b", "after"):
        c.core.delete_namespaced_pod(name, dra_ns)
    c.wait(lambda: not node.claims(), "every claim unprepared through the restarted plugin")
    assert not [p for p in specs.values() if p.exists()]
    assert not list(node.cdi_dir.glob("*.json"))


def overcommit(c: DraCluster, namespaces: list[str]) -> list[str]:
    """Each GPU's allocated shares (every claim of the namespaces) against its ResourceSlice's capacities: what
    exceeds them."""
    offered = {(sl["spec"]["pool"]["name"], d["name"]): {k: parse_quantity(q["value"])
                                                         for k, q in d["capacity"].items()}
               for node in c.nodes for sl in c.slices(node.name) for d in sl["spec"].get("devices", [])
               if "capacity" in d}
    used: dict[tuple[str, str], dict[str, Any]] = {}
    for ns in namespaces:
        for claim in c.resource("resourceclaims", ns):
            for r in (claim["status"].get("allocation") or {}).get("devices", {}).get("results", []):
                u = used.setdefault((r["pool"], r["device"]), {})
                for k, q in (r.get("consumedCapacity") or {}).items():
                    u[k] = u.get(k, 0) + parse_quantity(q)
    return [f"{dev} {k}: {v} > {offered[dev][k]}" for dev, u in used.items() for k, v in u.items()
            if v > offered[dev][k]]


def test_seeded_churn_never_overcommits_and_the_nodes_hold_exactly_the_running_claims(dra_cluster: DraCluster,
                                                                                       dra_ns: str) -> None:
    """Seeded churn of pods with share claims of random sizes (on the policy's steps), created and deleted through
    the whole chain: no GPU's allocations ever exceed its slice's memory or cores, and once settled each node's
    DRA manager holds exactly the claims of its Running pods, with one CDI spec each."""
    c = dra_cluster
    rng = random.Random(17)
    sizes = [(m, k) for m in ("1Gi", "2Gi", "4Gi", "8Gi") for k in ("10", "20", "30", "50")]
    for m, k in sizes:
        c.create_resource("resourceclaimtemplates", claim_template(f"s-{m.lower()}-{k}", m, k), dra_ns)
    alive: list[str] = []
    for op in range(48):
        if alive and (len(alive) >= 20 or rng.random() < 0.3):
            name = alive.pop(rng.randrange(len(alive)))
            c.core.delete_namespaced_pod(name, dra_ns)
        else:
            m, k = rng.choice(sizes)
            name = f"p{op}"
            c.core.create_namespaced_pod(dra_ns, pod_with_claim(name, f"s-{m.lower()}-{k}"))
            alive.append(name)
        if op % 8 == 7:
            assert overcommit(c, [dra_ns]) == []
        time.sleep(rng.uniform(0, 0.2))

    def settled() -> list[k8s.V1Pod] | None:
        pods = c.core.list_namespaced_pod(dra_ns).items
        if sorted(p.metadata.name for p in pods) != sorted(alive):
            return None  # deletions still finishing
        assert not [(p.metadata.name, p.status.message) for p in pods if p.status.phase == "Failed"]
        unschedulable = [p for p in pods if any(x.type == "PodScheduled" and x.status == "False"
                                                for x in (p.status.conditions or []))]
        if len([p for p in pods if p.status.phase == "Running"]) + len(unschedulable) != len(pods):
            return None
        run = [p for p in pods if p.status.phase == "Running"]
        for node in c.nodes:  # pending pods may still be placed as deletions free room: all checks in one pass
            held = node.claims()
            specs = sorted(p.name for p in node.cdi_dir.glob("*.json"))
            on_node = {p.metadata.uid for p in run if p.spec.node_name == node.name}
            if ({u for h in held for u in h["podUIDs"]} != on_node
                    or specs != sorted(f"gpushare.io-gpu_{h['uid']}.json" for h in held)):
                return None
        return run

    run = c.wait(settled, "the churn settled: each pod Running or unschedulable, each node holding exactly the "
                 "claims of its Running pods with one CDI spec each", timeout=120)
    assert overcommit(c, [dra_ns]) == []
    print(f"churn: {len(run)} pods Running, {len(alive) - len(run)} unschedulable")
