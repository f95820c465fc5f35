"""A node with MIG GPUs on the real cluster (real kube-apiserver and kube-scheduler with the extender, the
kubelet's device manager in the node agent, pods run with runc, the NVIDIA toolkit's rules): the node advertises
its whole GPUs and MIG devices, a share placed in a MIG device runs there and, from inside its container, NVIDIA's
CUDA runtime sees its slice of the MIG device through the MIG device's UUID, and a whole MIG device is seen with
the MIG device's memory, not its GPU's."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin_sim.mig_layouts import mig_node
from tests.realk8s.cluster import COUNT, MEM, Cluster, Spec, running
from tests.realk8s.inside import GiB, MiB, View
from tests.realk8s.loopback import namespace_for_test
from tests.realk8s.podspecs import Ask, pod, settled_and_recorded, wait_pods

pytestmark = pytest.mark.realk8s

LAYOUT = tuple(mig_node("rk-mig"))  # GPU 0 and 2 whole A100 80GB, GPU 1 as 3g.40gb + 2g.20gb + 1g.10gb
MIG_UUIDS = {m.uuid: m for m in LAYOUT[1].mig_devices}


@pytest.fixture(scope="module")
def mig() -> Iterator[Cluster]:
    with running(Spec(nodes=1, gpus=3, gpu_mib=80 * 1024, node_layouts=(LAYOUT,))) as cluster:
        yield cluster


@pytest.fixture
def mns(mig: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from namespace_for_test(mig, request, "mig", lines=80, timeout=120)


def running_pod(cluster: Cluster, ns: str, name: str) -> dict:
    pods = wait_pods(cluster.core, ns, lambda ps: any(p.metadata.name == name and settled_and_recorded(p) for p in ps),
                     f"{name} Running with its record")
    p = next(p for p in pods if p.metadata.name == name)
    assert p.status.phase == "Running", (p.status.phase, p.status.message)
    return dict(json.loads((p.metadata.annotations or {}).get("gpushare.io/allocated", "{}")))


def granted(record: dict) -> list[str]:
    return [s["uuid"] for s in record["containers"]["c0"]]


def test_the_node_advertises_whole_gpus_and_mig_devices_and_publishes_them_under_their_gpu(mig: Cluster) -> None:
    node = mig.core.read_node(mig.nodes[0].name)
    assert node.status.allocatable[MEM] == str(80 + 80 + 39 + 19 + 9)
    assert node.status.allocatable[COUNT] == "5"
    inv = c.parse_inventory(node.metadata.annotations[c.ANN_NODE_GPUS])
    assert {g.uuid: (g.parent_uuid, g.mig_profile) for g in inv.gpus if g.parent_uuid} == {
        u: (LAYOUT[1].uuid, m.profile) for u, m in MIG_UUIDS.items()}
    assert LAYOUT[1].uuid not in {g.uuid for g in inv.gpus}


def test_a_whole_mig_device_is_seen_with_its_memory_not_its_gpus(mig: Cluster, mns: str) -> None:
    # three whole-device pods on a node with two whole GPUs: at least one gets a MIG device
    for i in range(3):
        mig.core.create_namespaced_pod(mns, pod(f"whole{i}", [Ask(count=1)]))
    got = {f"whole{i}": granted(running_pod(mig, mns, f"whole{i}"))[0] for i in range(3)}
    assert len(set(got.values())) == 3, got
    in_mig = {name: uuid for name, uuid in got.items() if uuid in MIG_UUIDS}
    assert in_mig, got
    for name, uuid in in_mig.items():
        view = View(mig.probe(mns, name, "c0"))
        assert view.runtime_total == MIG_UUIDS[uuid].memory_mib * MiB, view.raw["runtime"]
        assert not view.limits, "a whole device gets no cap"


def test_a_share_in_a_mig_device_sees_its_slice_of_it_through_the_mig_uuid(mig: Cluster, mns: str) -> None:
    mig.core.create_namespaced_pod(mns, pod("share", [Ask(mem=4, core=30)]))
    [uuid] = granted(running_pod(mig, mns, "share"))
    assert uuid in MIG_UUIDS, f"binpack puts 4 GiB in the fullest device it fits: a MIG device, not {uuid}"
    view = View(mig.probe(mns, "share", "c0"))
    assert view.shim_loaded
    lim = view.limits
    assert lim["device.0.uuid"] == uuid and int(lim["device.0.memory_limit"]) == 4 * GiB, lim
    assert view.runtime_step("init") is not None and view.runtime_step("init")["rc"] == 0, view.raw["runtime"]
    assert view.runtime_total == 4 * GiB, view.raw["runtime"]
