"""A change of the advertised device health caused by an allocation (a GPU taken whole, or its first slice) is sent
to the kubelet again a moment later, so that the kubelet's device checkpoint on disk, which a list's write may
overwrite with a snapshot taken before the allocation was recorded, is written once more from a fresh one
(devplugin/deviceplugin/devices.py)."""

from __future__ import annotations

import threading
import time

from devplugin.allocation.node import Node
from devplugin.allocation.units import Kind, MemUnit
from devplugin.deviceplugin.devices import SHARED, WHOLE, DeviceBoard
from tests.support.nodes import make_gpus


def _next(board: DeviceBoard, kind: Kind, seen: int, timeout: float = 5) -> int:
    alive = threading.Event()
    alive.set()
    timer = threading.Timer(timeout, alive.clear)
    timer.start()
    try:
        got = board.wait_change(kind, seen, alive)
    finally:
        timer.cancel()
    assert got is not None, f"{kind} was not sent again within {timeout} s"
    return got[0]


def test_an_occupancy_change_is_sent_once_at_once_and_once_more_after_the_resend_delay() -> None:
    node = Node(gpus=make_gpus([16] * 2), unit=MemUnit(1024))
    board = DeviceBoard(node, resend_s=0.3)
    try:
        v0, first = board.snapshot(Kind.MEM)
        start = time.monotonic()
        assert board.set_occupancy({node.gpus[0].uuid: WHOLE, node.gpus[1].uuid: SHARED})
        v1, changed = board.snapshot(Kind.MEM)
        assert v1 == v0 + 1 and changed != first  # GPU 0's units went Unhealthy at once
        v2 = _next(board, Kind.MEM, v1)
        assert v2 == v1 + 1 and time.monotonic() - start >= 0.25
        assert board.snapshot(Kind.MEM)[1] == changed  # the same list, sent again
        assert _next(board, Kind.COUNT, board.snapshot(Kind.COUNT)[0] - 1) >= 2  # gpu-count: changed and resent
        time.sleep(0.5)
        assert board.snapshot(Kind.MEM)[0] == v2  # once, not on and on
    finally:
        board.close()


def test_changes_within_the_delay_are_sent_again_once_and_a_closed_board_sends_nothing() -> None:
    node = Node(gpus=make_gpus([16] * 2), unit=MemUnit(1024))
    board = DeviceBoard(node, resend_s=0.3)
    v0 = board.snapshot(Kind.MEM)[0]
    board.set_occupancy({node.gpus[0].uuid: WHOLE})
    board.set_occupancy({node.gpus[0].uuid: WHOLE, node.gpus[1].uuid: WHOLE})
    assert board.snapshot(Kind.MEM)[0] == v0 + 2
    assert _next(board, Kind.MEM, v0 + 2) == v0 + 3  # waited for, not slept for: a loaded machine's timer is late
    time.sleep(0.5)
    assert board.snapshot(Kind.MEM)[0] == v0 + 3  # one resend for both changes
    board.set_occupancy({})
    board.close()
    time.sleep(0.5)
    assert board.snapshot(Kind.MEM)[0] == v0 + 4  # the change itself, no resend after close
