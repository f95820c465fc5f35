"""Every bad request gets a clear error that says what was wrong and what to do, never a placeholder answer."""

from __future__ import annotations

import grpc
import pytest

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.errors import NoRoom, PairingConflict, RequestError
from devplugin.allocation.units import Kind, encode_id
from tests.support.nodes import MiniKubelet, make_node

MEM, CORE, COUNT = Kind.MEM, Kind.CORE, Kind.COUNT


@pytest.fixture
def k() -> MiniKubelet:
    node = make_node()
    return MiniKubelet(node, Allocator(node, pair_window_s=60))


def uid(k: MiniKubelet, i: int) -> str:
    return k.node.gpus[i].uuid


def test_unknown_id(k: MiniKubelet) -> None:
    with pytest.raises(RequestError, match="unknown device ID.*not a device ID of this plugin"):
        k.allocator.allocate(MEM, ["no-gpu-has-2GiB-to-run"])


def test_id_of_a_gpu_the_node_lacks(k: MiniKubelet) -> None:
    with pytest.raises(RequestError, match="which this node does not have"):
        k.allocator.allocate(MEM, [encode_id("GPU-deadbeef", MEM, 0)])


def test_unit_beyond_the_gpu(k: MiniKubelet) -> None:
    with pytest.raises(RequestError, match="beyond GPU 0's 15 units"):
        k.allocator.allocate(MEM, [encode_id(uid(k, 0), MEM, 15)])


def test_repeated_id(k: MiniKubelet) -> None:
    dev = encode_id(uid(k, 0), MEM, 1)
    with pytest.raises(RequestError, match="twice"):
        k.allocator.allocate(MEM, [dev, dev])


def test_wrong_resource_kind(k: MiniKubelet) -> None:
    with pytest.raises(RequestError, match="gpu-core.percentage device"):
        k.allocator.allocate(MEM, [encode_id(uid(k, 0), CORE, 1)])


def test_ids_from_two_gpus_for_a_one_gpu_request(k: MiniKubelet) -> None:
    ids = [encode_id(uid(k, 0), MEM, 0), encode_id(uid(k, 1), MEM, 0)]
    with pytest.raises(RequestError, match="IDs from GPUs 0, 1 for a one-GPU request"):
        k.allocator.allocate(MEM, ids)


@pytest.mark.parametrize("size", [3, 33, 105, 0])
def test_core_not_a_multiple_of_5_or_above_100(k: MiniKubelet, size: int) -> None:
    with pytest.raises(RequestError, match=r"multiple of 5 from 5 to 100|must be positive"):
        k.allocator.preferred(CORE, k.available(CORE), [], size)


def test_core_allocate_not_a_multiple_of_5(k: MiniKubelet) -> None:
    ids = [encode_id(uid(k, 0), CORE, n) for n in range(7)]
    with pytest.raises(RequestError, match="7 is not a valid compute share"):
        k.allocator.allocate(CORE, ids)


def test_paired_resources_on_two_gpus(k: MiniKubelet) -> None:
    k.allocator.allocate(MEM, [encode_id(uid(k, 0), MEM, 0)])
    with pytest.raises(PairingConflict, match="gpu-mem is on GPU 0.*gpu-core.percentage devices are on GPU 2"):
        k.allocator.allocate(CORE, [encode_id(uid(k, 2), CORE, n) for n in range(5)])


def test_second_half_does_not_fit_on_the_chosen_gpu(k: MiniKubelet) -> None:
    k.admit({MEM: 14, CORE: 5})  # GPU0: 1 GiB and 95 % left
    k.allocator.preferred(MEM, k.available(MEM), [], 1)  # binpack picks GPU0 for the memory
    with pytest.raises(PairingConflict, match=r"asks for 100 but GPU 0 .* has only 95 free"):
        k.allocator.preferred(CORE, k.available(CORE), [], 100)


def test_no_room_names_each_gpu(k: MiniKubelet) -> None:
    with pytest.raises(NoRoom, match=r"no single GPU has 16 free units \(GPU 0: 15, GPU 1: 15"):
        k.allocator.preferred(MEM, k.available(MEM), [], 16)


def test_more_whole_gpus_than_the_node_has(k: MiniKubelet) -> None:
    with pytest.raises(NoRoom, match="5 GPUs requested but this node has 4"):
        k.allocator.preferred(COUNT, k.available(COUNT), [], 5)


def test_must_include_not_available(k: MiniKubelet) -> None:
    with pytest.raises(RequestError, match="must-include IDs are not among the available"):
        k.allocator.preferred(MEM, k.available(MEM)[1:], k.available(MEM)[:1], 2)


def test_empty_allocate(k: MiniKubelet) -> None:
    with pytest.raises(RequestError, match="no device IDs"):
        k.allocator.allocate(MEM, [])


def test_error_codes() -> None:
    assert RequestError.code is grpc.StatusCode.INVALID_ARGUMENT
    assert NoRoom.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert PairingConflict.code is grpc.StatusCode.FAILED_PRECONDITION


def test_errors_change_nothing(k: MiniKubelet) -> None:
    before = {kind: k.allocator.holdings.free(kind, uid(k, 0)) for kind in (MEM, CORE)}
    with pytest.raises(RequestError):
        k.allocator.allocate(MEM, [encode_id(uid(k, 0), MEM, 0), encode_id(uid(k, 1), MEM, 0)])
    assert {kind: k.allocator.holdings.free(kind, uid(k, 0)) for kind in (MEM, CORE)} == before


def test_a_refused_container_does_not_capture_the_next_one(k: MiniKubelet) -> None:
    k.admit({MEM: 14, CORE: 5})  # GPU0: 1 GiB and 95 % left
    with pytest.raises(PairingConflict):
        k.admit({MEM: 1, CORE: 100}, order=[MEM, CORE])  # memory lands on GPU0, compute cannot follow
    k.rollback()
    grants = k.admit({CORE: 20, MEM: 1}, order=[CORE, MEM])  # the next container, other order
    assert grants[MEM].gpus == grants[CORE].gpus


def test_a_container_the_kubelet_rejects_by_itself_does_not_split_the_next_one(k: MiniKubelet) -> None:
    # The kubelet allocates A's memory, then finds too few compute devices and rejects A without calling us.
    ids = k.allocator.preferred(MEM, k.available(MEM), [], 2)
    k.allocator.allocate(MEM, ids)  # A's memory; A is then rolled back by the kubelet: IDs never held
    grants = k.admit({CORE: 10, MEM: 3}, order=[CORE, MEM])  # B joins A's stale decision first...
    assert grants[MEM].gpus == grants[CORE].gpus  # ...and its memory still follows its compute
