"""A claim's allocation to what the node prepares: shares summed per GPU into one budget, whole GPUs, and every
hostile or broken claim refused with a message naming the claim, the device or GPU and the capacity."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplugin import contract
from devplugin.dra.claims import ClaimError, ClaimRef, budgets, claim_limits, shares_of
from devplugin.dra.slices import devices_by_name
from tests.dra.objects import GPUS, NODE, GiB, claim, result

UID = "0f0e6a3c-1111-4222-8333-944455556666"
REF = ClaimRef("team-a", "c1", UID)
DEVICES = devices_by_name(GPUS)


def limits_of(obj: Any) -> Any:
    shares = shares_of(obj, REF, NODE, DEVICES)
    return claim_limits(budgets(shares, REF))


def test_a_share_becomes_the_limits_the_scheduler_granted() -> None:
    shares = shares_of(claim(UID, [result("gpu-1", "2Gi", "30")]), REF, NODE, DEVICES)
    assert [(s.device, s.gpu.index, s.memory, s.cores, s.whole) for s in shares] == [("gpu-1", 1, 2 * GiB, 30, False)]
    assert limits_of(claim(UID, [result("gpu-1", "2Gi", "30")])) == contract.Limits(
        devices=(contract.DeviceLimit(GPUS[1].uuid, 2 * GiB, 30),))


def test_shares_of_one_claim_on_one_gpu_add_up_to_one_budget() -> None:
    obj = claim(UID, [result("gpu-0", "2Gi", "30", request="a"), result("gpu-0", "1Gi", "20", request="b"),
                      result("gpu-1", "4Gi", "50", request="c")])
    assert limits_of(obj) == contract.Limits(devices=(contract.DeviceLimit(GPUS[0].uuid, 3 * GiB, 50),
                                                      contract.DeviceLimit(GPUS[1].uuid, 4 * GiB, 50)))


def test_a_whole_gpu_needs_no_limits_and_is_unlimited_next_to_a_share() -> None:
    assert limits_of(claim(UID, [result("gpu-0-whole")])) is None
    mixed = limits_of(claim(UID, [result("gpu-0-whole"), result("gpu-1", "1Gi", "10")]))
    assert mixed.devices == (contract.DeviceLimit(GPUS[0].uuid, 0, 100), contract.DeviceLimit(GPUS[1].uuid, GiB, 10))


def test_other_drivers_results_are_theirs() -> None:
    obj = claim(UID, [result("gpu-0", "1Gi", "10"), result("nic-0", driver="net.example.com", pool="x")])
    assert [s.device for s in shares_of(obj, REF, NODE, DEVICES)] == ["gpu-0"]


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c["metadata"].update(uid="other"), "UID 'other'.*deleted and created again"),
    (lambda c: c.pop("status"), "not allocated"),
    (lambda c: c["status"]["allocation"]["devices"].update(results=[]), "no device of driver gpu.gpushare.io"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="gpu-7"),
     "device 'gpu-7' is not a device of this node"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="node-b"), "not on this node"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].pop("consumedCapacity"),
     "gpu-0 \\(GPU 0, GPU-00000000.*no consumedCapacity"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"].pop("cores"),
     "consumedCapacity has no 'cores'"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"].update(memory="16Gi"),
     "GPU 0.*memory 17179869184 bytes is not a multiple of 268435456 from 268435456 to 16106127360"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"].update(cores="33"),
     "cores 33 is not a multiple of 5"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"].update(memory="-1Gi"),
     "capacity 'memory'.*negative"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].pop("shareID"), "shareID of device gpu-0"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device=["gpu-0"]), "device.*is not a name"),
])
def test_broken_or_hostile_claims_are_refused_clearly(mutate: Any, message: str) -> None:
    obj = claim(UID, [result("gpu-0", "2Gi", "30")])
    mutate(obj)
    with pytest.raises(ClaimError, match=message) as err:
        limits_of(obj)
    assert "team-a/c1" in str(err.value)


def test_shares_adding_up_beyond_the_gpu_are_refused() -> None:
    obj = claim(UID, [result("gpu-0", "10Gi", "60", request="a"), result("gpu-0", "10Gi", "60", request="b")])
    with pytest.raises(ClaimError, match="GPU 0 .* add up to memory 21474836480 bytes, more than the 16106127360"):
        limits_of(obj)


def test_a_gpu_whole_and_shared_in_one_claim_is_refused() -> None:
    with pytest.raises(ClaimError, match="allocated whole and as a share"):
        limits_of(claim(UID, [result("gpu-0-whole"), result("gpu-0", "1Gi", "5")]))


JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                max_size=4), max_leaves=20)


@settings(max_examples=300)
@given(st.sampled_from(["request", "driver", "pool", "device", "shareID", "consumedCapacity"]), JUNK)
def test_any_junk_in_a_result_is_a_claim_error_or_a_valid_share(field: str, junk: object) -> None:
    obj = claim(UID, [result("gpu-0", "2Gi", "30")])
    obj["status"]["allocation"]["devices"]["results"][0][field] = junk
    try:
        limits = limits_of(copy.deepcopy(obj))
    except ClaimError as exc:
        assert "team-a/c1" in str(exc)
    else:
        for d in (limits.devices if limits else ()):
            assert 0 <= d.memory_limit <= 15 * GiB and 1 <= d.sm_limit <= 100


@given(JUNK)
def test_any_junk_as_the_whole_claim_is_a_claim_error(junk: object) -> None:
    with pytest.raises(ClaimError):
        limits_of(junk)
