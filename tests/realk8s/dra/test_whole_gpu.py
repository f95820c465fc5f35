"""The real kube-apiserver and kube-scheduler (1.36, e2e/bin) on the slices `devplugin dra` publishes: shares of
one GPU coexist, a whole-GPU claim waits while any share holds the GPU and gets it once the shares are gone, and a
share waits while a whole claim holds it (the shared counter of partitionable devices,
docs/reference/dra-node.md); a GPU the health watcher failed is tainted and gets no new claim."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplugin import contract
from devplugin.dra.publisher import SlicePublisher
from devplugin.dra.slices import build_slices
from devplugin.gpu.device import GPU
from devplugin.gpu.facts import GpuFacts
from tests.dra.realk8s_dra import (
    WHOLE_CLASS,
    DraCluster,
    add_node,
    deallocate,
    dra_cluster,
    pod_with_claims,
    share_claim,
    wait_for,
)

pytestmark = pytest.mark.realk8s
GiB = 1 << 30
NS = "default"


def gpus(node: str, count: int) -> list[GPU]:
    return [GPU(index=i, uuid=f"GPU-{node}-{i:04d}-0000-0000-000000000000", name="NVIDIA A100-SXM4-80GB",
                memory_bytes=15 * GiB, minor=i, pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=0)
            for i in range(count)]


FACTS = GpuFacts(compute_capability={}, driver_version="550.54.15")


@pytest.fixture(scope="module")
def cluster() -> Iterator[DraCluster]:
    root = Path(tempfile.mkdtemp(prefix="dra-k8s-"))
    with dra_cluster(root) as dc:
        yield dc


def publish(dc: DraCluster, node: str, count: int, unhealthy: dict[str, str] | None = None) -> SlicePublisher:
    add_node(dc, node)
    pub = SlicePublisher(dc.client, node, lambda gen: build_slices(node, gpus(node, count), FACTS,
                                                                   unhealthy or {}, gen))
    assert pub.sync(), pub.last_error
    return pub


def scheduled(dc: DraCluster, pod: str) -> str:
    return str(dc.pod(NS, pod)["spec"].get("nodeName") or "")


def unschedulable(dc: DraCluster, pod: str) -> str:
    """The scheduler's message when it has marked the pod unschedulable, else ""."""
    for cond in dc.pod(NS, pod).get("status", {}).get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "False":
            return str(cond.get("message", ""))
    return ""


def run(dc: DraCluster, name: str, claim: dict, node: str) -> None:
    dc.resource.create_namespaced_resource_claim(NS, claim)
    dc.core.create_namespaced_pod(NS, pod_with_claims(NS, name, [claim["metadata"]["name"]], node))


def results(dc: DraCluster, claim: str) -> list[dict]:
    return list(dc.claim(NS, claim)["status"]["allocation"]["devices"]["results"])


def end(dc: DraCluster, pod: str, claim: str) -> None:
    dc.core.delete_namespaced_pod(pod, NS, grace_period_seconds=0)
    deallocate(dc, NS, claim)


def test_whole_gpu_and_shares_exclude_each_other(cluster: DraCluster) -> None:
    dc = cluster
    publish(dc, "n-excl", 1)
    run(dc, "p-s1", share_claim(NS, "s1", "2Gi", "30"), "n-excl")
    run(dc, "p-s2", share_claim(NS, "s2", "1000Mi", "33"), "n-excl")
    wait_for(lambda: scheduled(dc, "p-s1") and scheduled(dc, "p-s2"), "both shares scheduled")
    (r1,), (r2,) = results(dc, "s1"), results(dc, "s2")
    assert (r1["device"], r2["device"]) == ("gpu-0", "gpu-0"), "two shares live on one GPU"
    assert r1["consumedCapacity"] == {"memory": "2Gi", "cores": "30"} and r1["shareID"] != r2["shareID"]
    assert r2["consumedCapacity"] == {"memory": "1Gi", "cores": "35"}, "the scheduler rounds up to the steps"

    run(dc, "p-w1", share_claim(NS, "w1", cls=WHOLE_CLASS), "n-excl")
    msg = wait_for(lambda: unschedulable(dc, "p-w1"), "the whole-GPU pod marked unschedulable")
    assert "cannot allocate all claims" in msg and not scheduled(dc, "p-w1")
    end(dc, "p-s1", "s1")
    assert not scheduled(dc, "p-w1"), "one share still holds the GPU"
    end(dc, "p-s2", "s2")
    wait_for(lambda: scheduled(dc, "p-w1"), "the whole-GPU pod scheduled once the last share ended", timeout=60)
    (w,) = results(dc, "w1")
    assert w["device"] == "gpu-0-whole" and "shareID" not in w and "consumedCapacity" not in w

    run(dc, "p-s3", share_claim(NS, "s3", "1Gi", "5"), "n-excl")
    msg = wait_for(lambda: unschedulable(dc, "p-s3"), "the share pod marked unschedulable")
    assert "cannot allocate all claims" in msg
    end(dc, "p-w1", "w1")
    wait_for(lambda: scheduled(dc, "p-s3"), "the share scheduled once the whole GPU was freed", timeout=60)
    assert results(dc, "s3")[0]["device"] == "gpu-0"


def test_whole_claim_takes_a_free_gpu_next_to_shares(cluster: DraCluster) -> None:
    dc = cluster
    publish(dc, "n-two", 2)
    run(dc, "p-t1", share_claim(NS, "t1", "4Gi", "50"), "n-two")
    wait_for(lambda: scheduled(dc, "p-t1") == "n-two", "the share scheduled")
    run(dc, "p-tw", share_claim(NS, "tw", cls=WHOLE_CLASS), "n-two")
    wait_for(lambda: scheduled(dc, "p-tw") == "n-two", "the whole GPU scheduled")
    assert results(dc, "t1")[0]["device"] == "gpu-0" and results(dc, "tw")[0]["device"] == "gpu-1-whole"


def test_an_unhealthy_gpu_is_tainted_and_gets_no_new_claim(cluster: DraCluster) -> None:
    dc = cluster
    node = "n-sick"
    sick: dict[str, str] = {gpus(node, 1)[0].uuid: "XID 79 (GPU has fallen off the bus)"}
    pub = publish(dc, node, 1, sick)
    slice_ = dc.resource.read_resource_slice(f"{node}-gpushare-devices", _preload_content=False)
    assert b'"gpu.gpushare.io/unhealthy"' in slice_.data and b'"xid-79"' in slice_.data
    run(dc, "p-sick", share_claim(NS, "sick", "1Gi", "10"), node)
    assert "cannot allocate all claims" in wait_for(lambda: unschedulable(dc, "p-sick"), "pod unschedulable")
    sick.clear()
    assert pub.sync()
    wait_for(lambda: scheduled(dc, "p-sick") == node, "the pod scheduled once the GPU recovered", timeout=60)


def test_slices_deleted_by_someone_are_recreated_with_a_new_generation(cluster: DraCluster) -> None:
    dc = cluster
    pub = publish(dc, "n-del", 1)
    first = pub.generation
    dc.resource.delete_resource_slice("n-del-gpushare-devices")
    assert pub.sync()
    obj = dc.resource.read_resource_slice("n-del-gpushare-devices")
    assert obj.spec.pool.generation == first + 1 and obj.spec.driver == contract.DRA_DRIVER
    assert pub.sync() and pub.generation == first + 1, "nothing changed: no new write"


def test_a_node_whose_gpus_are_gone_publishes_an_empty_pool(cluster: DraCluster) -> None:
    dc = cluster
    offered = gpus("n-gone", 1)
    add_node(dc, "n-gone")
    pub = SlicePublisher(dc.client, "n-gone", lambda gen: build_slices("n-gone", offered, FACTS, {}, gen))
    assert pub.sync(), pub.last_error
    offered.clear()
    assert pub.sync(), pub.last_error
    names = [s.metadata.name for s in dc.resource.list_resource_slice(field_selector="spec.nodeName=n-gone").items]
    assert names == ["n-gone-gpushare-devices"]
    obj = dc.resource.read_resource_slice("n-gone-gpushare-devices")
    assert obj.spec.devices in (None, []) and obj.spec.pool.resource_slice_count == 1
