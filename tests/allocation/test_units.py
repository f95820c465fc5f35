"""Device IDs encode their GPU, stay within 63 characters, and the node's device list fits one kubelet message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devplugin.allocation.node import Node
from devplugin.allocation.units import (
    InvalidDeviceID,
    Kind,
    MemUnit,
    UnitTooFine,
    check_message_size,
    decode_id,
    device_ids,
    encode_id,
    list_and_watch_bound,
    parse_mem_unit,
    units_per_gpu,
)
from devplugin.api.deviceplugin.v1beta1 import api_pb2
from devplugin.deviceplugin.devices import DeviceBoard
from tests.support.nodes import make_gpus

uuids = st.uuids().map(lambda u: f"GPU-{u}")


@given(uuid=uuids, kind=st.sampled_from(list(Kind)), n=st.integers(0, 99_999))
def test_id_round_trip_and_length(uuid: str, kind: Kind, n: int) -> None:
    dev_id = encode_id(uuid, kind, n)
    assert len(dev_id) <= 63
    assert decode_id(dev_id) == (uuid, kind, 0 if kind is Kind.COUNT else n)


@given(st.text(max_size=80))
def test_decode_never_accepts_garbage_silently(text: str) -> None:
    try:
        uuid, kind, n = decode_id(text)
    except InvalidDeviceID:
        return
    assert encode_id(uuid, kind, n) == text


@pytest.mark.parametrize("bad", ["GPU-1::x3", "GPU-1::m", "GPU-1::m-1", "GPU-1::m01", "::m1", "GPU-1::g7", "m1"])
def test_decode_rejects(bad: str) -> None:
    with pytest.raises(InvalidDeviceID):
        decode_id(bad)


def test_overlong_uuid_refused() -> None:
    with pytest.raises(InvalidDeviceID, match="63"):
        encode_id("MIG-" + "a" * 60, Kind.MEM, 1)


@pytest.mark.parametrize(("text", "mib"), [("GiB", 1024), ("1GiB", 1024), ("512MiB", 512), ("256MiB", 256),
                                           ("128MiB", 128), ("128", 128)])
def test_parse_mem_unit(text: str, mib: int) -> None:
    assert parse_mem_unit(text).mib == mib


@pytest.mark.parametrize("bad", ["", "3GiB", "100MiB", "0", "2048MiB", "lots"])
def test_parse_mem_unit_rejects_with_advice(bad: str) -> None:
    with pytest.raises(ValueError, match="512MiB"):
        parse_mem_unit(bad)


def test_mixed_sizes_keep_their_own_size() -> None:
    gpus = make_gpus([80, 80, 24, 24])
    assert [units_per_gpu(g, Kind.MEM, MemUnit(1024)) for g in gpus] == [80, 80, 24, 24]
    assert [units_per_gpu(g, Kind.MEM, MemUnit(512)) for g in gpus] == [160, 160, 48, 48]
    assert all(units_per_gpu(g, Kind.CORE, MemUnit(1024)) == 100 for g in gpus)


def test_ids_name_their_gpu() -> None:
    gpu = make_gpus([15])[0]
    ids = device_ids(gpu, Kind.MEM, MemUnit(1024))
    assert len(ids) == 15 and {decode_id(i)[0] for i in ids} == {gpu.uuid}


@pytest.mark.parametrize("mib", [1024, 512, 256, 128])
def test_selectable_units_fit_on_8_x_141_gib(mib: int) -> None:
    gpus = make_gpus([141] * 8)
    check_message_size(gpus, MemUnit(mib))  # does not raise


def test_unit_guard_refuses_and_names_a_coarser_unit_on_8_x_141_gib() -> None:
    gpus = make_gpus([141] * 8)
    with pytest.raises(UnitTooFine, match=r"use --mem-unit 32MiB or coarser") as err:
        check_message_size(gpus, MemUnit(1))
    assert "4 MiB" in str(err.value)
    check_message_size(gpus, MemUnit(32))


def test_bound_is_not_below_the_real_message_size() -> None:
    node = Node(gpus=make_gpus([141] * 8), unit=MemUnit(128))
    board = DeviceBoard(node)
    for kind in node.kinds:
        _, message = board.snapshot(kind)
        assert isinstance(message, api_pb2.ListAndWatchResponse)
        assert message.ByteSize() <= list_and_watch_bound(list(node.gpus), kind, node.unit)
        assert message.ByteSize() > 0.7 * list_and_watch_bound(list(node.gpus), kind, node.unit)
