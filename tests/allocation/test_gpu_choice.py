"""Which GPU a scheduler chose, as the node daemon reads it from the pod: ours, ACK's and Alibaba's annotations."""

from __future__ import annotations

from devplugin import contract as c
from devplugin.allocation.requests import pod_request
from devplugin.allocation.scheduler_choice import assume_time, scheduler_choice
from tests.support.nodes import make_node

NODE = make_node([15] * 4)


def pod(annotations: dict[str, str], containers: int = 2) -> object:
    return pod_request({
        "metadata": {"name": "p", "namespace": "default", "uid": "u", "annotations": annotations},
        "spec": {"nodeName": "n",
                 "initContainers": [{"name": "init", "resources": {"limits": {"aliyun.com/gpu-mem": "1"}}}],
                 "containers": [{"name": f"c{i}", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}
                                for i in range(containers)]}})


def test_acks_allocation_names_each_app_container_by_its_index() -> None:
    p = pod({c.ANN_ACK_ALLOCATION: '{"0":{"1":2},"1":{"3":2}}', c.ANN_ACK_ASSUME_TIME: "1700000000000000000"})
    first, second = p.container("c0"), p.container("c1")
    assert scheduler_choice(p, first, NODE)[0].gpus == (NODE.gpus[1].uuid,)
    assert scheduler_choice(p, second, NODE)[0].gpus == (NODE.gpus[3].uuid,)
    assert scheduler_choice(p, second, NODE)[0].source == c.ANN_ACK_ALLOCATION
    assert scheduler_choice(p, p.container("init"), NODE) == (None, "")  # ACK's index counts app containers only
    assert assume_time(p) == 1700000000000000000


def test_our_annotation_wins_and_names_gpus_by_uuid() -> None:
    ours = c.PodAssignment(node="n", time_ns=5, containers={
        "c0": (c.GpuShare(index=0, uuid=NODE.gpus[2].uuid, mem=2, core=0),)}).render()
    p = pod({c.ANN_SCHEDULED: ours, c.ANN_ALIYUN_MEM_IDX: "1"})
    choice, _ = scheduler_choice(p, p.container("c0"), NODE)
    assert choice is not None and choice.gpus == (NODE.gpus[2].uuid,)  # the UUID, not the stale index
    choice, _ = scheduler_choice(p, p.container("c1"), NODE)  # not in ours: Alibaba's pod-wide index
    assert choice is not None and choice.gpus == (NODE.gpus[1].uuid,) and choice.source == c.ANN_ALIYUN_MEM_IDX


def test_unreadable_or_foreign_choices_say_why_and_choose_nothing() -> None:
    p = pod({c.ANN_SCHEDULED: "{not json", c.ANN_ALIYUN_MEM_IDX: "7"})
    choice, why = scheduler_choice(p, p.container("c0"), NODE)
    assert choice is None
    assert "not JSON" in why and "ALIYUN_COM_GPU_MEM_IDX='7' is not a GPU index of this node" in why
