"""What the admission path asks the kubelet's PodResources. Without a pod cache, a two-resource container placed by
node-local pairing is synced with PodResources once (its first call); its second call asks only which pods the
kubelet lists (bench/real_admission.py: each read of the devices the kubelet lists, and the sync over them, is
time on the kubelet's admission). With a pod cache the second call of a container placed by pairing still syncs
(tests/allocation/test_identity_lookup_timeout.py: the sync names the container from its first resource's devices)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from devplugin.allocation.units import Kind, decode_id
from devplugin.kube.podresources import list_node, list_pods
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import seed_node
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.support.daemon_harness import CORE, MEM, Running, running


def count_reads(r: Running) -> Counter[str]:
    """Counts the allocator's PodResources syncs ("sync") and pods-only reads ("pods") from now on."""
    assert r.nd is not None
    allocator = r.nd.allocator
    calls: Counter[str] = Counter()
    read_kubelet = allocator.read_kubelet
    read_pods = getattr(allocator, "read_pods", None)
    assert read_kubelet is not None

    def counted(name: str, read: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            calls[name] += 1
            return read()
        return call

    allocator.read_kubelet = counted("sync", read_kubelet)  # type: ignore[assignment]
    if read_pods is not None:
        allocator.read_pods = counted("pods", read_pods)  # type: ignore[assignment]
    return calls


def one_gpu(device_ids: dict[str, list[str]]) -> set[str]:
    return {decode_id(i)[0] for ids in device_ids.values() for i in ids}


def test_without_a_pod_cache_a_container_is_synced_once_and_paired_on_one_gpu() -> None:
    with running(seed_node(4, 8192), seed=3) as r:
        assert r.registered_all()
        calls = count_reads(r)
        for i in range(6):
            calls.clear()
            spec = PodSpec(name=f"p{i}", containers=[ContainerSpec("main", {MEM: 3, CORE: 30})])
            got = r.kubelet.admit(spec).container("main")
            assert len(one_gpu(got.device_ids)) == 1, f"pod p{i}: its two resources landed on {one_gpu(got.device_ids)}"
            assert calls == {"sync": 1, "pods": 1}, (
                f"pod p{i}: the admission synced with PodResources {calls['sync']} time(s) and read only its pods "
                f"{calls['pods']} time(s); want one sync (first call) and one pods-only read (second call)")


def test_without_a_pod_cache_a_pod_listed_since_the_first_call_still_ends_the_pairing() -> None:
    """A container asking for gpu-mem alone, then a container asking for both whose gpu-core.percentage the kubelet
    may ask for first (it walks a Go map): the pods-only read sees the second pod listed and does not pair its
    compute with the first container's memory (which would split the second container over two GPUs)."""
    with running(seed_node(4, 8192), seed=3, placement="spread") as r:
        assert r.registered_all()
        for i in range(10):
            alone = PodSpec(name=f"mem-only{i}", containers=[ContainerSpec("main", {MEM: 6})])
            r.kubelet.admit(alone)
            both = PodSpec(name=f"both{i}", containers=[ContainerSpec("main", {MEM: 1, CORE: 10})])
            ids = r.kubelet.admit(both).container("main").device_ids
            assert len(one_gpu(ids)) == 1, f"pod both{i}: split over {one_gpu(ids)}"
            r.kubelet.remove_pod(alone.uid)
            r.kubelet.remove_pod(both.uid)


def test_with_a_pod_cache_the_second_call_of_a_paired_container_still_syncs(api: FakeApiserver) -> None:
    with running(seed_node(2, 8192), apiserver=api, seed=3) as r:
        assert r.registered_all()
        api.down()  # the lookup does not answer: node-local pairing
        calls = count_reads(r)
        pod = api.add_pod(name="late", node_name=r.node_name, limits={MEM: "2", CORE: "20"})
        got = r.admit(pod).containers[0]  # type: ignore[attr-defined]
        api.up()
        assert len(one_gpu(got.device_ids)) == 1
        assert calls["pods"] == 0 and calls["sync"] >= 2, calls


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
