"""What the admission path asks the kubelet: without an apiserver, a two-resource container is synced with the
kubelet's PodResources once (its first call); its second call asks only which pods the kubelet lists (bench/
real_admission.py: every read of the devices the kubelet lists, and the sync over them, is time on the kubelet's
admission)."""

from __future__ import annotations

from collections import Counter

from devplugin.allocation.units import Kind, decode_id
from devplugin.kube.podresources import list_node, list_pods
from devplugin_sim.fake_driver import seed_node
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.daemon_harness import CORE, MEM, running


def test_a_container_is_synced_once_and_paired_on_one_gpu() -> None:
    with running(seed_node(4, 8192), seed=3) as r:
        assert r.registered_all()
        assert r.nd is not None
        allocator = r.nd.allocator
        calls: Counter[str] = Counter()
        read_kubelet, read_pods = allocator.read_kubelet, allocator.read_pods
        assert read_kubelet is not None and read_pods is not None

        def counted_sync():  # type: ignore[no-untyped-def]
            calls["sync"] += 1
            return read_kubelet()

        def counted_pods():  # type: ignore[no-untyped-def]
            calls["pods"] += 1
            return read_pods()

        allocator.read_kubelet, allocator.read_pods = counted_sync, counted_pods
        for i in range(4):
            calls.clear()
            spec = PodSpec(name=f"p{i}", containers=[ContainerSpec("main", {MEM: 3, CORE: 30})])
            got = r.kubelet.admit(spec).container("main")
            gpus = {decode_id(i)[0] for ids in got.device_ids.values() for i in ids}
            assert len(gpus) == 1, f"pod p{i}: its gpu-mem and gpu-core.percentage landed on {sorted(gpus)}"
            assert calls == {"sync": 1, "pods": 1}, (
                f"pod p{i}: the admission synced with PodResources {calls['sync']} time(s) and read its pods "
                f"{calls['pods']} time(s); want one sync (first call) and one pods-only read (second call)")


def test_list_pods_names_the_pods_list_node_names() -> None:
    with running(seed_node(2, 8192), seed=3) as r:
        assert r.registered_all()
        r.kubelet.admit(PodSpec(name="a", containers=[ContainerSpec("main", {MEM: 2, CORE: 20})]))
        r.kubelet.admit(PodSpec(name="b", containers=[ContainerSpec("main", {MEM: 1})]))
        node = r.nd.allocator.node if r.nd else None
        assert node is not None
        full = list_node(str(r.pod_resources), {node.resource_name(k): k for k in node.kinds})
        assert full is not None
        assert list_pods(str(r.pod_resources)) == full.pods
        assert {name for _, name in full.pods} == {"a", "b"}
        held = {c.pod: {k: len(v) for k, v in c.devices.items()} for c in full.containers}
        assert held == {"a": {Kind.MEM: 2, Kind.CORE: 20}, "b": {Kind.MEM: 1}}
        assert list_pods(str(r.root / "no-such.sock"), timeout_s=0.2) is None
