"""The cluster contract's formats: what the node daemon, the extender and inspect write and read, round trip and
refusal of what cannot be trusted (each error names the annotation and what is wrong)."""

from __future__ import annotations

import re

import pytest

from devplugin import contract as c
from devplugin.allocation.requests import (
    PodRequestError,
    check_core,
    per_gpu_share,
    pod_request,
)


def test_assignment_inventory_usage_and_ack_allocation_round_trip() -> None:
    a = c.PodAssignment(node="n1", time_ns=7, containers={
        "main": (c.GpuShare(index=1, uuid="GPU-a", mem=2, core=30),),
        "big": (c.GpuShare(index=0, uuid="GPU-b", mem=80, core=100, whole=True),)})
    assert c.parse_assignment(a.render()) == a
    inv = c.NodeInventory(mode="core_mem", placement="spread", mem_unit_mib=512,
                          gpus=(c.NodeGpu(0, "GPU-b", "H100", 160, 81920, healthy=False),))
    assert c.parse_inventory(inv.render()) == inv
    usage = c.NodeUsage(gpus={0: c.GpuUsage(mem=3, core=40, containers=2), 1: c.GpuUsage(whole=True)}, time_ns=9)
    assert c.parse_usage(usage.render()) == usage
    assert c.parse_ack_allocation(c.render_ack_allocation({0: {1: 2}, 1: {1: 7}})) == {0: {1: 2}, 1: {1: 7}}


@pytest.mark.parametrize(("text", "expect"), [
    ("{nope", "annotation gpushare.io/scheduled is not JSON"),
    ("[1, 2]", "must be a JSON object, not list"),
    ('{"containers": {"main": {"index": 0}}}', "container 'main': its GPUs must be a JSON list"),
    ('{"containers": {"main": [{"index": -1}]}}', "the number -1 is negative"),
    ('{"containers": {"main": [{"index": 0, "core": 150}]}}', "core is 150; it must be 0..100"),
    ('{"containers": {"main": [{"uuid": "GPU-a"}]}}', "annotation gpushare.io/scheduled: container 'main': GPU "
                                                       "entry 0: no index"),
    ('{"time": 1e999}', "the number 1e999 is not a whole number"),
    ('{"time": 1.5}', "the number 1.5 is not a whole number"),
    ('{"time": NaN}', "NaN is not a number JSON allows"),
    ('{"time": 99999999999999999999}', "is larger than 9223372036854775807"),
    ('{"containers": {"main": [{"index": true}]}}', "index must be a whole number 0..1023, not true"),
    ('{"containers": {"main": [{"index": 0, "mem": 4294967296}]}}', "mem is 4294967296; it must be 0..2147483647"),
    ('{"node": 7}', "node must be text, not 7"),
    ("[" * 50000 + "]" * 50000, "is 100000 characters long; at most 65536 are read"),
    ("[" * 30000 + "]" * 30000, "nested too deeply"),
])
def test_a_scheduled_annotation_that_cannot_be_trusted_is_refused_with_the_reason(text: str, expect: str) -> None:
    with pytest.raises(c.AnnotationError, match=re.escape(expect)):
        c.parse_assignment(text)


@pytest.mark.parametrize(("text", "expect"), [
    ('{"0": {"0": -15}}', "the number -15 is negative"),
    ('{"0": {"0": 1e999}}', "the number 1e999 is not a whole number"),
    ('{"\u00b9": {"0": 1}}', "container index is '\u00b9'; it must be a whole number"),
    ('{"0": {"\u0661": 1}}', "GPU index is '\u0661'"),
    ('{"0": {"0": false}}', "container 0: GPU 0 must be a whole number"),
    ('{"0": [1]}', "container 0 must be a JSON object"),
])
def test_an_ack_allocation_that_cannot_be_trusted_is_refused_with_the_reason(text: str, expect: str) -> None:
    with pytest.raises(c.AnnotationError, match=re.escape(f"annotation {c.ANN_ACK_ALLOCATION}")) as err:
        c.parse_ack_allocation(text)
    assert expect in str(err.value)


@pytest.mark.parametrize("text", ["\u00b2", "\u00b9\u00b9", "-1", "1e9", " 7", "", "1" * 20, "\u0661\u0662"])
def test_assume_times_and_gpu_indexes_take_ascii_digits_only(text: str) -> None:
    with pytest.raises(c.AnnotationError, match="must be a whole number 0..9223372036854775807 written in the digits"):
        c.parse_assume_time(text, c.ANN_ACK_ASSUME_TIME)
    with pytest.raises(c.AnnotationError, match=c.ANN_ALIYUN_MEM_IDX):
        c.parse_gpu_index(text)
    assert c.parse_assume_time("1700000000000000000", c.ANN_ACK_ASSUME_TIME) == 1700000000000000000
    assert c.parse_gpu_index("3") == 3


@pytest.mark.parametrize(("parse", "name"), [(c.parse_inventory, c.ANN_NODE_GPUS), (c.parse_usage, c.ANN_NODE_USAGE),
                                             (c.parse_ack_allocation, c.ANN_ACK_ALLOCATION)])
def test_node_and_ack_annotations_name_themselves_when_broken(parse, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(c.AnnotationError, match=name):
        parse('{"gpus": "not a list", "0": 3}')


def _pod(limits: dict[str, object], labels: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": "p", "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


@pytest.mark.parametrize(("value", "expect"), [("1.5", "not a whole number"), ("2Gi", "is more than 2147483647"),
                                               ("500m", "not a whole number"), ("1e999", "is more than"),
                                               (True, "is not a quantity"), ("-1", "is negative"),
                                               ("\u00b9", "is not a Kubernetes quantity"),
                                               ("\u0661", "is not a Kubernetes quantity"),
                                               ("1_000", "is not a Kubernetes quantity"),
                                               ("NaN", "is not a Kubernetes quantity")])
def test_a_quantity_that_is_not_a_whole_number_of_units_is_refused(value: object, expect: str) -> None:
    with pytest.raises(PodRequestError, match=f"container 'main': aliyun.com/gpu-mem: .*{expect}"):
        pod_request(_pod({"aliyun.com/gpu-mem": value}))


def test_whole_quantities_in_their_usual_spellings_are_read() -> None:
    req = pod_request(_pod({"aliyun.com/gpu-mem": "2", "aliyun.com/gpu-core.percentage": 30, "aliyun.com/gpu-count":
                            "1k"})).containers[0]
    assert (req.mem, req.core, req.count) == (2, 30, 1000)
    # the apiserver keeps these spellings as written; they are the integers 10, 2,000,000 and 1,024
    req = pod_request(_pod({"aliyun.com/gpu-mem": "1e1", "aliyun.com/gpu-core.percentage": "2M",
                            "aliyun.com/gpu-count": "1Ki"})).containers[0]
    assert (req.mem, req.core, req.count) == (10, 2_000_000, 1024)
    assert pod_request(_pod({"aliyun.com/gpu-mem": "1.0"})).containers[0].mem == 1


def test_a_multi_gpu_count_that_is_not_a_positive_whole_number_is_refused() -> None:
    with pytest.raises(PodRequestError, match="multi-GPU count 'two'.*is not a whole number"):
        pod_request(_pod({"aliyun.com/gpu-mem": "4"}, labels={c.LABEL_ACK_MULTI_GPU: "two"}))
    with pytest.raises(PodRequestError, match="multi-GPU count '-2'.*is not a whole number 1..1024"):
        pod_request(_pod({"aliyun.com/gpu-mem": "4"}, labels={c.LABEL_ACK_MULTI_GPU: "-2"}))
    with pytest.raises(PodRequestError, match="multi-GPU count '\u00b2'"):
        pod_request(_pod({"aliyun.com/gpu-mem": "4"}, labels={c.LABEL_ACK_MULTI_GPU: "\u00b2"}))
    assert pod_request(_pod({"aliyun.com/gpu-mem": "4"}, labels={c.LABEL_ACK_MULTI_GPU: "2"})).gpus_per_container == 2


def test_a_multi_gpu_share_must_split_into_whole_units_and_valid_core_steps() -> None:
    even = pod_request(_pod({"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-core.percentage": "20"})).containers[0]
    assert per_gpu_share(even, 2) == (4, 10)
    with pytest.raises(PodRequestError, match="9 gpu-mem units do not split evenly over 8 GPUs; ask for a multiple"):
        per_gpu_share(pod_request(_pod({"aliyun.com/gpu-mem": "9"})).containers[0], 8)
    with pytest.raises(PodRequestError, match="10 over 4 GPUs gives 2.5 % each; ask for a multiple of 20"):
        per_gpu_share(pod_request(_pod({"aliyun.com/gpu-mem": "8",
                                        "aliyun.com/gpu-core.percentage": "10"})).containers[0], 4)
    assert "multiple of 5" in (check_core(33) or "")
    assert check_core(150, gpus=2) is None and check_core(205, gpus=2) is not None
