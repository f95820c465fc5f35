"""GPU health survives a daemon restart: the state file, its corruption, reboots, and the daemon over the kubelet."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path

import pytest

from devplugin.gpu.health import HealthWatcher
from devplugin.gpu.health_state import STATE_FILE, Fault, HealthStore
from devplugin.gpu.inventory import enumerate_gpus
from devplugin_sim.fake_driver import seed_uuid

TRANSIENT_XID = 8


class Changes:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, str]] = []
        self._cond = threading.Condition()

    def __call__(self, uuid: str, healthy: bool, reason: str) -> None:
        with self._cond:
            self.calls.append((uuid, healthy, reason))
            self._cond.notify_all()

    def wait(self, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.calls) >= n, timeout)

    def brief(self) -> list[tuple[str, bool]]:
        return [(u, h) for u, h, _ in self.calls]


@pytest.fixture
def watcher_on(seed_driver):
    """watcher_on(store, **kw) -> (started HealthWatcher, Changes); all stopped after the test."""
    started: list[HealthWatcher] = []

    def start(store: HealthStore, **kwargs: object) -> tuple[HealthWatcher, Changes]:
        changes = Changes()
        kwargs.setdefault("recovery_seconds", 0.3)
        watcher = HealthWatcher(enumerate_gpus(), changes, store=store, wait_timeout_ms=200, **kwargs)
        watcher.start()
        started.append(watcher)
        return watcher, changes

    yield start
    for watcher in started:
        watcher.stop()


def saved(uuid: str, xid: int | None, needs_reset: bool, boot_id: str = "boot-1") -> Fault:
    return Fault(xid, f"XID {xid} on a GPU", "2026-11-23T07:00:00+00:00", needs_reset, boot_id)


# ---- the file ------------------------------------------------------------------------------------------


def test_the_state_file_records_unhealthy_gpus_by_uuid(seed_driver, watcher_on, tmp_path) -> None:
    store = HealthStore(tmp_path / "state", boot_id="boot-1")
    _, changes = watcher_on(store)
    seed_driver.raise_xid(2, 48)
    assert changes.wait(1, timeout=1)
    doc = json.loads((tmp_path / "state" / STATE_FILE).read_text())
    entry = doc["gpus"][seed_uuid(2)]
    assert doc["version"] == 1 and list(doc["gpus"]) == [seed_uuid(2)]
    assert entry["xid"] == 48 and entry["needs_reset"] is True and entry["boot_id"] == "boot-1"
    assert "XID 48" in entry["reason"] and entry["since"].startswith("20")
    assert [p.name for p in (tmp_path / "state").iterdir()] == [STATE_FILE]  # no temporary file left behind


def test_a_recovered_gpu_leaves_the_state_file(seed_driver, watcher_on, tmp_path) -> None:
    store = HealthStore(tmp_path, boot_id="boot-1")
    _, changes = watcher_on(store)
    seed_driver.raise_xid(0, TRANSIENT_XID)
    assert changes.wait(1, timeout=1)
    assert set(store.load()) == {seed_uuid(0)}
    assert changes.wait(2, timeout=2)
    assert store.load() == {}


def test_a_healthy_node_writes_nothing(seed_driver, watcher_on, tmp_path) -> None:
    watcher_on(HealthStore(tmp_path / "state"))
    time.sleep(0.2)
    assert not (tmp_path / "state").exists()


# ---- restart -------------------------------------------------------------------------------------------


def test_a_restarted_watcher_starts_saved_gpus_unhealthy_under_the_same_rules(seed_driver, watcher_on,
                                                                             tmp_path) -> None:
    store = HealthStore(tmp_path, boot_id="boot-1")
    first, changes = watcher_on(store, recovery_seconds=5.0)
    seed_driver.raise_xid(1, 79)
    seed_driver.raise_xid(3, TRANSIENT_XID)
    assert changes.wait(2, timeout=2)
    first.stop()

    second, again = watcher_on(HealthStore(tmp_path, boot_id="boot-1"), recovery_seconds=0.3)
    assert set(again.brief()) == {(seed_uuid(1), False), (seed_uuid(3), False)}  # reported during start()
    assert all("unhealthy before the daemon restarted" in reason for _, _, reason in again.calls)
    assert again.wait(3, timeout=2)  # the transient one recovers after its window
    time.sleep(0.8)
    assert again.brief()[2:] == [(seed_uuid(3), True)]
    assert second.unhealthy() == {seed_uuid(1)}
    assert set(store.load()) == {seed_uuid(1)}


def test_a_reboot_since_the_fault_counts_as_the_reset(seed_driver, watcher_on, tmp_path) -> None:
    HealthStore(tmp_path, boot_id="boot-1").save({seed_uuid(0): saved(seed_uuid(0), 48, True)})
    store = HealthStore(tmp_path, boot_id="boot-2")
    watcher, changes = watcher_on(store)
    time.sleep(0.2)
    assert changes.calls == [] and watcher.unhealthy() == frozenset()
    assert store.load() == {}


def test_a_reboot_does_not_clear_a_gpu_whose_row_remapping_failed(seed_driver, watcher_on, tmp_path,
                                                                  monkeypatch) -> None:
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlDeviceGetRemappedRows", lambda handle: (0, 4, 0, 1))
    HealthStore(tmp_path, boot_id="boot-1").save({seed_uuid(0): saved(seed_uuid(0), 64, True)})
    watcher, changes = watcher_on(HealthStore(tmp_path, boot_id="boot-2"))
    assert changes.brief() == [(seed_uuid(0), False)]
    assert watcher.unhealthy() == {seed_uuid(0)}


def test_the_same_boot_keeps_a_gpu_that_needs_a_reset_unhealthy(seed_driver, watcher_on, tmp_path) -> None:
    HealthStore(tmp_path, boot_id="boot-1").save({seed_uuid(2): saved(seed_uuid(2), 95, True)})
    watcher, changes = watcher_on(HealthStore(tmp_path, boot_id="boot-1"), recovery_seconds=0.2)
    time.sleep(1.0)
    assert changes.brief() == [(seed_uuid(2), False)]
    assert watcher.unhealthy() == {seed_uuid(2)}


def test_a_saved_gpu_no_longer_on_the_node_is_forgotten(seed_driver, watcher_on, tmp_path, caplog) -> None:
    gone = "GPU-00000000-0000-0000-0000-000000000000"
    HealthStore(tmp_path, boot_id="boot-1").save({gone: saved(gone, 48, True),
                                                  seed_uuid(1): saved(seed_uuid(1), 48, True)})
    store = HealthStore(tmp_path, boot_id="boot-1")
    with caplog.at_level(logging.INFO, logger="devplugin.gpu.health"):
        _, changes = watcher_on(store)
    assert changes.brief() == [(seed_uuid(1), False)]
    assert f"{gone}" in caplog.text and "forgetting it" in caplog.text
    assert set(store.load()) == {seed_uuid(1)}


# ---- broken state ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [
    "{not json",
    '{"version": 7, "gpus": {}}',
    '{"version": 1, "gpus": {"GPU-1": {"xid": "48", "reason": "r", "since": "2026-01-01T00:00:00", '
    '"needs_reset": true, "boot_id": ""}}}',
    '{"version": 1, "gpus": {"GPU-1": {"xid": 48, "reason": "r", "since": "yesterday", "needs_reset": true}}}',
    '[]',
])
def test_a_corrupt_state_file_warns_and_starts_clean(seed_driver, watcher_on, tmp_path, caplog,
                                                     content: str) -> None:
    (tmp_path / STATE_FILE).write_text(content)
    with caplog.at_level(logging.WARNING, logger="devplugin.gpu.health_state"):
        watcher, changes = watcher_on(HealthStore(tmp_path))
    assert f"the saved GPU health {tmp_path / STATE_FILE} is corrupt" in caplog.text
    assert "Delete the file or fix it" in caplog.text
    assert changes.calls == [] and watcher.unhealthy() == frozenset()
    seed_driver.raise_xid(0, 48)  # still watching; the next change rewrites the file
    assert changes.wait(1, timeout=1)
    assert set(HealthStore(tmp_path).load()) == {seed_uuid(0)}


def test_an_unreadable_state_file_warns_and_starts_clean(seed_driver, watcher_on, tmp_path, caplog) -> None:
    (tmp_path / STATE_FILE).mkdir()  # a directory where the file should be: reading fails
    with caplog.at_level(logging.WARNING, logger="devplugin.gpu.health_state"):
        watcher, changes = watcher_on(HealthStore(tmp_path))
    assert f"cannot read the saved GPU health {tmp_path / STATE_FILE}" in caplog.text
    assert "make it readable or delete it" in caplog.text
    assert watcher.unhealthy() == frozenset()


def test_an_unwritable_state_dir_warns_once_and_health_still_works(seed_driver, watcher_on, tmp_path,
                                                                   caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="devplugin.gpu.health_state"):
        _, changes = watcher_on(HealthStore(blocker / "state"))
        seed_driver.raise_xid(0, 48)
        seed_driver.raise_xid(1, 48)
        assert changes.wait(2, timeout=2)
    assert changes.brief() == [(seed_uuid(0), False), (seed_uuid(1), False)]
    assert caplog.text.count("cannot save GPU health") == 1
    assert "make --state-dir writable" in caplog.text


# ---- the daemon, through the kubelet ---------------------------------------------------------------------


def test_the_daemon_keeps_a_reset_xid_across_restart_until_the_marker() -> None:
    from tests.support.daemon_harness import MEM, running, short_dir  # the whole daemon: only this test needs it

    state = short_dir()
    try:
        with running(recovery_seconds=0.3, state_dir=str(state)) as r:
            assert r.registered_all()
            r.driver.raise_xid(1, 48)
            assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 45, timeout=5)
            assert not r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 60, timeout=1.5)
        with running(recovery_seconds=0.3, state_dir=str(state)) as r:  # a new daemon, the same node
            assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 45, timeout=10)
            gpu1 = r.daemon.node.gpus[1].uuid
            assert all(h == "Unhealthy" for i, h in r.kubelet.devices(MEM).items() if i.startswith(gpu1))
            marker = Path(state) / "reset-done" / gpu1
            marker.parent.mkdir()
            marker.touch()
            assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 60, timeout=5)
    finally:
        shutil.rmtree(state, ignore_errors=True)
