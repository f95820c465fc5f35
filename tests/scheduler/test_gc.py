"""The scheduler service leaves Python's full collections to its housekeeping thread: a verb that leaves many
objects behind (a preemption over thousands of nodes, a burst of watch events) does not set one off on whichever
call runs next, as Python's own schedule would; the young generations are collected as before."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from devplugin.scheduler import service


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def _generations_collected_while_keeping(count: int) -> set[int]:
    """Which generations Python collects on its own while `count` objects outlive the young collections."""
    gc.collect()  # Python compares what survived since with what its last full collection kept
    kept: list[list[int]] = []
    seen: set[int] = set()

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            seen.add(info["generation"])

    gc.callbacks.append(note)
    try:
        kept.extend([i] for i in range(count))
    finally:
        gc.callbacks.remove(note)
    return seen


@pytest.mark.usefixtures("thresholds")
def test_no_full_collection_lands_on_a_call() -> None:
    count = len(gc.get_objects()) + 20_000  # more than a quarter of what a full collection keeps
    assert 2 in _generations_collected_while_keeping(count), "Python's own schedule collects fully here"
    service.collect_oldest_on_schedule()
    assert _generations_collected_while_keeping(count) == {0, 1}


def test_housekeeping_collects_fully_every_freeze_interval() -> None:
    full = []

    def note(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(note)
    try:
        assert service.collect_oldest(0.0, now=100.0) == 100.0 and len(full) == 1
        assert service.collect_oldest(100.0, now=100.0 + service.FREEZE_EVERY_S - 1) == 100.0 and len(full) == 1
        later = 100.0 + service.FREEZE_EVERY_S
        assert service.collect_oldest(100.0, now=later) == later and len(full) == 2
    finally:
        gc.callbacks.remove(note)
