"""The ResourceSlices `devplugin dra` publishes: devices, attributes, capacities and their request policies, the
shared counter that keeps whole GPUs and shares apart, health taints; the capacity arithmetic under hypothesis."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devplugin import contract
from devplugin.dra.capacity import MEMORY_STEP, CapacityError, GpuCapacity, check_share, memory_offered, parse_amount
from devplugin.dra.slices import MAX_GPUS, build_slices, devices_by_name, semver, taint_value
from devplugin.gpu.facts import GpuFacts
from tests.dra.objects import GPUS, NODE, GiB, MiB, gpu

FACTS = GpuFacts(compute_capability={GPUS[0].uuid: "7.0", GPUS[1].uuid: "8.6"}, driver_version="550.54.15")


def test_each_gpu_is_a_shared_and_a_whole_device_on_one_counter() -> None:
    counters, devices = build_slices(NODE, GPUS, FACTS, {}, generation=3)
    for obj in (counters, devices):
        spec = obj["spec"]
        assert spec["driver"] == contract.DRA_DRIVER and spec["nodeName"] == NODE
        assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 2}
    assert counters["spec"]["sharedCounters"] == [{"name": "gpus", "counters": {"gpu-0": {"value": "1"},
                                                                                "gpu-1": {"value": "1"}}}]
    devs = {d["name"]: d for d in devices["spec"]["devices"]}
    assert list(devs) == ["gpu-0", "gpu-0-whole", "gpu-1", "gpu-1-whole"], "GPU order: the scheduler fills GPU 0 first"
    share, whole = devs["gpu-1"], devs["gpu-1-whole"]
    assert share["allowMultipleAllocations"] is True and "allowMultipleAllocations" not in whole
    assert share["consumesCounters"] == whole["consumesCounters"] == [
        {"counterSet": "gpus", "counters": {"gpu-1": {"value": "1"}}}]
    assert share["attributes"] == {
        "type": {"string": "share"}, "index": {"int": 1}, "uuid": {"string": GPUS[1].uuid},
        "productName": {"string": "Tesla V100-SXM2-16GB"}, "numaNode": {"int": 0},
        "computeCapability": {"version": "8.6.0"}, "driverVersion": {"version": "550.54.15"}}
    assert whole["attributes"]["type"] == {"string": "whole"}
    assert "nvlinkIsland" not in share["attributes"], "a GPU without NVLink has no island to match on"
    assert share["capacity"]["memory"] == {"value": str(15 * GiB), "requestPolicy": {
        "default": str(256 * MiB), "validRange": {"min": str(256 * MiB), "max": str(15 * GiB), "step": str(256 * MiB)}}}
    assert share["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "5", "validRange": {"min": "5", "max": "100", "step": "5"}}}
    assert whole["capacity"] == {"memory": {"value": str(15 * GiB)}, "cores": {"value": "100"}}
    assert "taints" not in share


def test_the_nvlink_island_and_numa_node_are_attributes_where_known() -> None:
    linked = [replace(gpu(i), nvlink_island=i // 2, numa_node=None if i == 3 else i // 2) for i in range(4)]
    _, devices = build_slices(NODE, linked, GpuFacts({}, ""), {}, 1)
    attrs = {d["name"]: d["attributes"] for d in devices["spec"]["devices"]}
    assert [attrs[f"gpu-{i}"][contract.DRA_ATTR_NVLINK_ISLAND] for i in range(4)] == [{"int": 0}, {"int": 0},
                                                                                       {"int": 1}, {"int": 1}]
    assert attrs["gpu-2-whole"][contract.DRA_ATTR_NVLINK_ISLAND] == {"int": 1}
    assert attrs["gpu-2"][contract.DRA_ATTR_NUMA_NODE] == {"int": 1}
    assert contract.DRA_ATTR_NUMA_NODE not in attrs["gpu-3"]


def test_an_unhealthy_gpu_carries_a_noschedule_taint_on_both_devices() -> None:
    _, devices = build_slices(NODE, GPUS, FACTS, {GPUS[0].uuid: "XID 48 (double-bit ECC error)"}, 1)
    devs = {d["name"]: d for d in devices["spec"]["devices"]}
    taint = {"key": contract.DRA_TAINT_UNHEALTHY, "value": "xid-48", "effect": "NoSchedule"}
    assert devs["gpu-0"]["taints"] == devs["gpu-0-whole"]["taints"] == [taint]
    assert "taints" not in devs["gpu-1"]


def test_memory_is_rounded_down_to_the_step_and_a_tiny_gpu_offers_nothing() -> None:
    odd = gpu(0, memory=16 * GiB - 5 * MiB)  # what NVML reports for a "16 GB" card
    tiny = gpu(1, memory=100 * MiB)
    _, devices = build_slices(NODE, [odd, tiny], GpuFacts({}, ""), {}, 1)
    names = [d["name"] for d in devices["spec"]["devices"]]
    assert names == ["gpu-0", "gpu-0-whole"]
    assert devices["spec"]["devices"][0]["capacity"]["memory"]["value"] == str(16 * GiB - 256 * MiB)
    assert "computeCapability" not in devices["spec"]["devices"][0]["attributes"], "unknown: not published"
    assert set(devices_by_name([odd])) == {"gpu-0", "gpu-0-whole"}


def test_more_gpus_than_a_pool_can_describe_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 32"):
        build_slices(NODE, [gpu(i) for i in range(MAX_GPUS + 1)], FACTS, {}, 1)


@pytest.mark.parametrize("raw,want", [("8.0", "8.0.0"), ("550.54.15", "550.54.15"), ("535.104.05", "535.104.5"),
                                      ("", ""), ("n/a", "")])
def test_versions_are_made_semantic(raw: str, want: str) -> None:
    assert semver(raw) == want


@given(st.text(max_size=300))
def test_taint_values_are_always_label_values(reason: str) -> None:
    value = taint_value(reason)
    assert 1 <= len(value) <= 63
    assert all(c.isascii() and (c.isalnum() or c in "-_.") for c in value)
    assert value[0].isalnum() and value[-1].isalnum()


@given(st.integers(min_value=0, max_value=1 << 50))
def test_memory_offered_is_the_largest_step_multiple_not_above_the_gpu(memory: int) -> None:
    offered = memory_offered(memory)
    assert offered % MEMORY_STEP == 0 and offered <= memory < offered + MEMORY_STEP


@given(st.integers(min_value=0, max_value=1 << 32), st.sampled_from(["", "Ki", "Mi", "Gi"]))
def test_quantities_parse_to_whole_numbers(n: int, suffix: str) -> None:
    scale = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[suffix]
    assert parse_amount("memory", f"{n}{suffix}") == n * scale


@given(st.one_of(st.text(max_size=80), st.floats(), st.booleans(), st.none(), st.lists(st.integers())))
def test_any_junk_is_a_capacity_error_or_a_whole_number(raw: object) -> None:
    try:
        value = parse_amount("cores", raw)
    except CapacityError as exc:
        assert "cores" in str(exc)
    else:
        assert isinstance(value, int) and value >= 0


@pytest.mark.parametrize("raw", ["1.5", "-1", "1e400000", "8Ei", "500m", "x" * 100, "NaN"])
def test_fractions_negatives_and_nonsense_are_refused(raw: str) -> None:
    with pytest.raises(CapacityError, match="memory"):
        parse_amount("memory", raw)


@given(st.integers(min_value=-(1 << 40), max_value=1 << 40), st.integers(min_value=-200, max_value=200))
def test_a_share_is_accepted_only_on_the_steps_within_the_gpu(memory: int, cores: int) -> None:
    offered = GpuCapacity(memory=15 * GiB)
    ok = (256 * MiB <= memory <= 15 * GiB and memory % (256 * MiB) == 0 and 5 <= cores <= 100 and cores % 5 == 0)
    try:
        check_share(memory, cores, offered)
    except CapacityError:
        assert not ok
    else:
        assert ok


def test_the_node_owns_its_slices_once_its_uid_is_known() -> None:
    assert all("ownerReferences" not in o["metadata"] for o in build_slices(NODE, GPUS, FACTS, {}, 1))
    for obj in build_slices(NODE, GPUS, FACTS, {}, 1, node_uid="u-1"):
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1", "controller": True}]


def test_a_node_with_nothing_to_offer_publishes_an_empty_devices_slice_alone() -> None:
    (only,) = build_slices(NODE, [gpu(0, memory=100 * MiB)], FACTS, {}, 4)
    assert only["metadata"]["name"] == f"{NODE}-gpushare-devices" and only["spec"]["devices"] == []
    assert only["spec"]["pool"] == {"name": NODE, "generation": 4, "resourceSliceCount": 1}
