"""The node daemon never places a container on a GPU its pod's annotations exclude, with or without a scheduler's
choice, and refuses the admission with an Event naming the annotation when nothing allowed has room: the real
daemon, the kubelet emulator over the real sockets and the fake apiserver (the real `kubernetes` client)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin.allocation.container_placement import Need, Room, place, plan_together
from devplugin.allocation.errors import NoRoom, RequestError
from devplugin.allocation.selected_gpus import excluded_gpus
from devplugin.allocation.units import Kind
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import seed_node
from devplugin_sim.kubelet import AdmissionError
from tests.allocation.test_gpu_selection import A100, H100
from tests.allocation.test_tenant_annotations import events
from tests.support.daemon_harness import Running, running
from tests.support.nodes import make_node

GPUS = [dataclasses.replace(g, name=A100 if g.index < 2 else H100) for g in seed_node(4, 15360)]


@pytest.fixture
def r(api: FakeApiserver) -> Iterator[Running]:
    with running(GPUS, apiserver=api) as run:
        assert run.registered_all()
        yield run


def gpu_of(result: object) -> str:
    return result.containers[0].envs["NVIDIA_VISIBLE_DEVICES"]  # type: ignore[attr-defined]


def test_a_model_choice_places_on_that_model_where_binpack_would_not(r: Running) -> None:
    p = r.pod("wants-h100", mem=2, core=10, annotations={c.ANN_USE_GPU_MODEL: "h100"})
    assert r.wait_cached(p)
    assert gpu_of(r.admit(p)) == GPUS[2].uuid  # binpack alone: GPU 0
    q = r.pod("hami-no-a100", mem=2, core=10, annotations={c.ANN_HAMI_NOUSE_GPU_TYPE: "A100"})
    assert r.wait_cached(q)
    assert gpu_of(r.admit(q)) == GPUS[2].uuid  # the fullest allowed GPU


def test_an_avoided_uuid_is_not_used_even_when_the_scheduler_chose_it(r: Running) -> None:
    chosen = c.PodAssignment(node="gpu-node", time_ns=5, containers={
        "main": (c.GpuShare(index=0, uuid=GPUS[0].uuid, mem=2, core=10),)}).render()
    p = r.pod("avoids-0", mem=2, core=10, annotations={c.ANN_AVOID_GPU_UUID: GPUS[0].uuid, c.ANN_SCHEDULED: chosen})
    assert r.wait_cached(p)
    assert gpu_of(r.admit(p)) == GPUS[1].uuid
    overridden = events(r, "avoids-0", "GPUChoiceOverridden")
    assert overridden and "excluded by the pod's GPU selection" in overridden[0]["message"]


def test_whole_gpus_come_only_from_the_allowed_ones(r: Running) -> None:
    p = r.pod("two-h100", count=2, annotations={c.ANN_USE_GPU_MODEL: "H100"})
    assert r.wait_cached(p)
    got = r.admit(p).containers[0].envs["NVIDIA_VISIBLE_DEVICES"]  # type: ignore[attr-defined]
    assert set(got.split(",")) == {GPUS[2].uuid, GPUS[3].uuid}


def test_no_allowed_room_refuses_the_admission_with_an_event_naming_the_annotation(r: Running) -> None:
    first = r.pod("fills", mem=15, core=100, annotations={c.ANN_USE_GPU_UUID: GPUS[3].uuid})
    assert r.wait_cached(first)
    assert gpu_of(r.admit(first)) == GPUS[3].uuid
    late = r.pod("late", mem=2, core=10, annotations={c.ANN_USE_GPU_UUID: GPUS[3].uuid})
    assert r.wait_cached(late)
    with pytest.raises(AdmissionError, match="excluded by the pod's GPU selection"):
        r.admit(late)
    refused = events(r, "late", "GPUAllocationFailed")
    assert refused
    msg = refused[0]["message"]
    assert f"GPU 0: excluded by the pod's GPU selection (not named in {c.ANN_USE_GPU_UUID})" in msg
    assert "GPU 3: 0 GiB free" in msg


def test_a_selection_that_excludes_every_gpu_of_the_node_says_what_the_node_has(r: Running) -> None:
    p = r.pod("wants-v100", mem=2, core=10, annotations={c.ANN_USE_GPU_MODEL: "V100"})
    assert r.wait_cached(p)
    with pytest.raises(AdmissionError, match="excludes every GPU of this node"):
        r.admit(p)
    msg = events(r, "wants-v100", "GPUAllocationFailed")[0]["message"]
    assert f"{c.ANN_USE_GPU_MODEL}=V100" in msg and f"GPUs 0,1 {A100!r}" in msg and GPUS[3].uuid in msg


def test_a_malformed_selection_is_refused_at_admission_with_the_reason(r: Running) -> None:
    p = r.pod("mig-uuid", mem=2, core=10, annotations={c.ANN_AVOID_GPU_UUID: "MIG-" + GPUS[0].uuid[4:]})
    assert r.wait_cached(p)
    with pytest.raises(AdmissionError, match="MIG instance's UUID"):
        r.admit(p)
    assert events(r, "mig-uuid", "GPUAllocationFailed")


def test_the_pods_containers_planned_together_stay_on_allowed_gpus() -> None:
    node = make_node([15] * 4)
    from devplugin.allocation.holdings import Holdings

    room = Room(node, Holdings(node), lambda u: True, excluded={node.gpus[0].uuid: "x", node.gpus[1].uuid: "y"})
    need = Need(per_gpu={Kind.MEM: 10})
    plan = plan_together(room, [need, need])
    assert plan is not None and {u for (u,) in plan} == {node.gpus[2].uuid, node.gpus[3].uuid}
    assert place(room, need).gpus[0] in (node.gpus[2].uuid, node.gpus[3].uuid)
    assert plan_together(room, [need, need, need]) is None
    with pytest.raises(NoRoom, match=r"GPU 1: excluded by the pod's GPU selection \(y\)"):
        place(room, Need(per_gpu={Kind.MEM: 10}, gpus=3))


def test_excluded_gpus_reads_the_pod_and_refuses_an_impossible_selection() -> None:
    from devplugin.allocation.requests import pod_request

    node = make_node([15] * 2)

    def pod(ann: dict[str, str]) -> object:
        return pod_request({"metadata": {"name": "p", "uid": "u", "annotations": ann}, "spec": {"containers": []}})

    assert excluded_gpus(pod({}), node) == {}  # type: ignore[arg-type]
    avoid = pod({c.ANN_AVOID_GPU_UUID: node.gpus[0].uuid})
    assert set(excluded_gpus(avoid, node)) == {node.gpus[0].uuid}  # type: ignore[arg-type]
    with pytest.raises(RequestError) as exc:
        excluded_gpus(pod({c.ANN_USE_GPU_MODEL: "H100"}), node)  # type: ignore[arg-type]
    assert exc.value.reason == "gpu_selection" and "NVIDIA Test" in str(exc.value)


def test_on_a_mig_node_a_gpus_uuid_chooses_its_mig_devices_and_a_profile_its_name(api: FakeApiserver) -> None:
    from devplugin_sim.mig_layouts import mig_node

    gpus = mig_node()  # two whole GPUs (0, 2) and GPU 1 split into 3g.40gb, 2g.20gb, 1g.10gb
    split = gpus[1]
    with running(gpus, apiserver=api) as r:
        assert r.registered_all()
        node = r.daemon.node
        assert set(excluded_gpus(_pod({c.ANN_AVOID_GPU_UUID: split.uuid}), node)) == {
            d.uuid for d in split.mig_devices}
        small = r.pod("small", mem=5, core=10, annotations={c.ANN_USE_GPU_UUID: split.uuid})
        assert r.wait_cached(small)
        assert gpu_of(r.admit(small)) == split.mig_devices[2].uuid  # binpack among its MIG devices: the 1g.10gb
        avoids = r.pod("avoids", mem=5, core=10, annotations={c.ANN_AVOID_GPU_UUID: split.uuid})
        assert r.wait_cached(avoids)
        assert gpu_of(r.admit(avoids)) == gpus[0].uuid
        profile = r.pod("profile", mem=5, core=10, annotations={c.ANN_USE_GPU_MODEL: "MIG 3g.40gb"})
        assert r.wait_cached(profile)
        assert gpu_of(r.admit(profile)) == split.mig_devices[0].uuid


def _pod(annotations: dict[str, str]):  # type: ignore[no-untyped-def]
    from devplugin.allocation.requests import pod_request

    return pod_request({"metadata": {"name": "p", "uid": "u", "annotations": annotations}, "spec": {"containers": []}})


def test_a_container_placed_for_another_that_asks_alike_is_refused_where_its_own_selection_excludes_the_gpu(
        r: Running) -> None:
    """Two pods pending at once ask alike: the kubelet admits the younger first, the daemon's first call places it
    as the likeliest (the older, which has no selection) on GPU 0, and PodResources then names it: it avoids GPU 0,
    so it is refused rather than left there or split."""
    older = r.pod("older", mem=3, core=15)
    assert r.wait_cached(older)
    younger = r.pod("younger", mem=3, core=15, annotations={c.ANN_AVOID_GPU_UUID: GPUS[0].uuid})
    assert r.wait_cached(younger)
    with pytest.raises(AdmissionError, match="its pod's GPU selection excludes GPU 0"):
        r.admit(younger)
    msg = events(r, "younger", "GPUAllocationFailed")[0]["message"]
    assert f"named in {c.ANN_AVOID_GPU_UUID}" in msg and "refusing rather than splitting it" in msg
