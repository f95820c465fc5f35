"""Node-local pairing without an apiserver (the kubelet emulator): an init container's devices handed to the app
container are recognised, fitting pods are admitted after a restart under a live kubelet, and a container asking for
one resource is not paired with the next pod. Defects of issue 14 (4 and 5), each a minimal reproduction."""

from __future__ import annotations

from devplugin_sim.fake_driver import seed_node
from devplugin_sim.kubelet_results import AdmissionError
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.support.daemon_harness import CORE, COUNT, MEM, running

NAMES = {"mem": MEM, "core": CORE, "count": COUNT}


def pod(name: str, init: dict[str, int] | None = None, **limits: int) -> PodSpec:
    spec = PodSpec(name=name, containers=[ContainerSpec("main", {NAMES[k]: v for k, v in limits.items()})])
    if init:
        spec.init_containers = [ContainerSpec("setup", {NAMES[k]: v for k, v in init.items()})]
    return spec


def gpus_of(ids: dict[str, list[str]]) -> set[str]:
    return {i.split("::")[0] for v in ids.values() for i in v}


def test_an_init_containers_devices_handed_to_the_app_container_are_recognised() -> None:
    """The kubelet gives the app container the init container's very device IDs (it does not ask the plugin):
    the pod is admitted, on one GPU, and the reused devices are counted once (defect 4)."""
    with running(seed_node(2, 8192), seed=2) as r:
        assert r.registered_all()
        for i in range(4):  # each resource order, twice
            got = r.kubelet.admit(pod(f"p{i}", init={"mem": 4, "core": 40}, mem=4, core=40))
            init, app = got.init_containers[0], got.containers[0]
            assert {k: set(v) for k, v in app.device_ids.items()} == {k: set(v) for k, v in init.device_ids.items()}
            assert len(gpus_of(app.device_ids)) == 1 and gpus_of(app.device_ids) == gpus_of(init.device_ids)
            assert app.envs["NVIDIA_VISIBLE_DEVICES"] == next(iter(gpus_of(app.device_ids)))
            r.kubelet.remove_pod(got.pod.uid)
        # partly reused: the init container's 2 GiB plus 2 more on the same GPU
        got = r.kubelet.admit(pod("part", init={"mem": 2}, mem=4, core=20))
        app = got.containers[0]
        assert set(got.init_containers[0].device_ids[MEM]) < set(app.device_ids[MEM])
        assert len(gpus_of(app.device_ids)) == 1


def test_after_a_restart_under_a_live_kubelet_fitting_pods_are_admitted() -> None:
    """The sizes that guide where a container's first resource goes are rebuilt from PodResources at start: a GPU
    whose compute is nearly taken is not chosen for the memory of a container whose compute cannot follow
    (defect 5)."""
    with running(seed_node(4, 15360), seed=5) as r:
        assert r.registered_all()
        r.kubelet.admit(pod("busy", mem=1, core=90))
        r.restart_daemon()
        assert r.registered_all()
        refused = []
        for i in range(6):  # 3 empty GPUs hold 2 of them each
            try:
                r.kubelet.admit(pod(f"p{i}", mem=2, core=50))
            except AdmissionError as exc:
                refused.append(str(exc))
        assert refused == []


def test_a_container_asking_for_one_resource_is_not_paired_with_the_next_pod() -> None:
    """Memory-only pods each followed by a pod asking for both, in either order: the kubelet lists the next pod in
    PodResources before admitting it, so its first call does not join the memory-only container (which split it
    over two GPUs, or refused it for lack of room on the other's GPU)."""
    with running(seed_node(4, 15360), seed=7) as r:
        assert r.registered_all()
        for i in range(8):
            r.kubelet.admit(pod(f"m{i}", mem=1))
            got = r.kubelet.admit(pod(f"b{i}", mem=6, core=50)).containers[0]
            assert len(gpus_of(got.device_ids)) == 1, got.device_ids
            assert got.conflicts == []
