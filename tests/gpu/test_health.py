"""HealthWatcher over the real pynvml and the fake driver: XIDs, ignore lists, lost GPUs, recovery, XIDs that need
a GPU reset, stopping."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from devplugin.gpu.health import DEFAULT_IGNORED_XIDS, DEFAULT_RESET_XIDS, WAIT_TIMEOUT_MS, HealthWatcher
from devplugin.gpu.health_state import HealthStore
from devplugin.gpu.inventory import enumerate_gpus
from devplugin_sim.fake_driver import FakeGPU, nvml_refcount, seed_node, seed_uuid


class Changes:
    """Records on_change calls; lets a test wait for the n-th."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, str, float]] = []
        self._cond = threading.Condition()

    def __call__(self, uuid: str, healthy: bool, reason: str) -> None:
        with self._cond:
            self.calls.append((uuid, healthy, reason, time.monotonic()))
            self._cond.notify_all()

    def wait(self, n: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.calls) >= n, timeout)

    def brief(self) -> list[tuple[str, bool]]:
        return [(u, h) for u, h, _, _ in self.calls]


@pytest.fixture
def watch(seed_driver):
    """watch(**kwargs) -> (HealthWatcher started on the seed node, Changes); stopped after the test."""
    started: list[HealthWatcher] = []

    def start(gpus=None, **kwargs) -> tuple[HealthWatcher, Changes]:
        changes = Changes()
        kwargs.setdefault("wait_timeout_ms", 200)  # quicker stops; the default is tested below
        watcher = HealthWatcher(gpus or enumerate_gpus(), changes, **kwargs)
        watcher.start()
        started.append(watcher)
        return watcher, changes

    yield start
    for watcher in started:
        watcher.stop()


TRANSIENT_XID = 8  # GPU stopped processing: critical, but NVIDIA's action is to restart the application


def test_default_ignore_list_is_nvidias() -> None:
    assert DEFAULT_IGNORED_XIDS == frozenset({13, 31, 43, 45, 68, 109})


def test_default_reset_list_holds_the_xids_that_need_a_reset() -> None:
    # 48 double-bit ECC, 63/64 page retirement or row remapping, 74 NVLink, 79 off the bus, 92/94/95 ECC
    assert DEFAULT_RESET_XIDS == frozenset({48, 63, 64, 74, 79, 92, 94, 95})
    assert not DEFAULT_RESET_XIDS & DEFAULT_IGNORED_XIDS


def test_critical_xid_marks_the_gpu_unhealthy_within_a_second(seed_driver, watch) -> None:
    watcher, changes = watch()
    raised = time.monotonic()
    seed_driver.raise_xid(2, 79)
    assert changes.wait(1, timeout=1.0)
    uuid, healthy, reason, at = changes.calls[0]
    assert (uuid, healthy) == (seed_uuid(2), False)
    assert "XID 79" in reason and "GPU 2" in reason
    assert at - raised < 1.0
    assert watcher.unhealthy() == {seed_uuid(2)}


def test_unhealthy_is_reported_once(seed_driver, watch) -> None:
    _, changes = watch()
    seed_driver.raise_xid(0, 79)
    seed_driver.raise_xid(0, 48)
    seed_driver.raise_xid(1, 79)
    assert changes.wait(2, timeout=2)
    time.sleep(0.1)
    assert changes.brief() == [(seed_uuid(0), False), (seed_uuid(1), False)]


def test_ignored_xid_changes_nothing(seed_driver, watch, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="devplugin.gpu.health"):
        _, changes = watch()
        seed_driver.raise_xid(1, 43)
        seed_driver.raise_xid(3, 79)  # processed after the ignored one: when it shows, the 43 was seen
        assert changes.wait(1, timeout=2)
    assert changes.brief() == [(seed_uuid(3), False)]
    assert "XID 43, ignored" in caplog.text


def test_custom_ignore_list(seed_driver, watch) -> None:
    _, changes = watch(ignored_xids=frozenset({79}))
    seed_driver.raise_xid(0, 79)
    seed_driver.raise_xid(1, 43)  # not ignored any more
    assert changes.wait(1, timeout=2)
    time.sleep(0.1)
    assert changes.brief() == [(seed_uuid(1), False)]


def test_recovers_after_the_window_without_critical_xids(seed_driver, watch) -> None:
    watcher, changes = watch(recovery_seconds=0.5)
    seed_driver.raise_xid(1, TRANSIENT_XID)
    assert changes.wait(1, timeout=1)
    assert changes.wait(2, timeout=3)
    (_, _, _, bad_at), (uuid, healthy, reason, good_at) = changes.calls
    assert (uuid, healthy) == (seed_uuid(1), True)
    assert reason == "recovered: no critical XID for 0.5 s and NVML answers"
    assert 0.45 <= good_at - bad_at < 1.5
    assert watcher.unhealthy() == frozenset()


def test_a_new_critical_xid_restarts_the_window(seed_driver, watch) -> None:
    _, changes = watch(recovery_seconds=0.6)
    seed_driver.raise_xid(1, TRANSIENT_XID)
    assert changes.wait(1, timeout=1)
    time.sleep(0.4)
    seed_driver.raise_xid(1, TRANSIENT_XID)
    second = time.monotonic()
    assert changes.wait(2, timeout=3)
    assert changes.calls[1][1] is True
    assert changes.calls[1][3] - second >= 0.55


def test_lost_gpu_stays_unhealthy_until_it_answers(seed_driver, watch) -> None:
    watcher, changes = watch(recovery_seconds=0.2)
    seed_driver.set_lost(2, True)
    assert changes.wait(1, timeout=1)
    uuid, healthy, reason, _ = changes.calls[0]
    assert (uuid, healthy) == (seed_uuid(2), False)
    assert "lost" in reason
    assert not changes.wait(2, timeout=1.0)  # several re-checks pass; it is still lost
    assert watcher.unhealthy() == {seed_uuid(2)}
    seed_driver.set_lost(2, False)
    assert changes.wait(2, timeout=1.5)
    assert changes.brief()[1] == (seed_uuid(2), True)


def test_gpu_lost_at_start_is_watched_once_it_is_back(seed_driver, watch) -> None:
    gpus = enumerate_gpus()
    seed_driver.set_lost(3, True)
    watcher, changes = watch(gpus, recovery_seconds=0.2)
    assert changes.brief() == [(seed_uuid(3), False)]  # reported during start()
    seed_driver.set_lost(3, False)
    assert changes.wait(2, timeout=1.5)
    seed_driver.raise_xid(3, TRANSIENT_XID)  # registered for events when it recovered
    assert changes.wait(3, timeout=1)
    assert changes.brief()[1:] == [(seed_uuid(3), True), (seed_uuid(3), False)]


def test_gpu_without_event_support_is_skipped_and_the_others_watched(make_driver, watch, caplog) -> None:
    gpus = seed_node(2)
    gpus[0] = FakeGPU(0, seed_uuid(0), "NVIDIA T4", 15360, 0, "00000000:00:07.0", events_supported=False)
    driver = make_driver(gpus)  # the newest driver is the one FAKE_NVML_CONFIG names
    with caplog.at_level(logging.WARNING, logger="devplugin.gpu.health"):
        _, changes = watch()
    assert f"GPU 0 ({seed_uuid(0)}): the driver does not deliver XID events" in caplog.text
    driver.raise_xid(1, 79)
    assert changes.wait(1, timeout=1)
    assert changes.brief() == [(seed_uuid(1), False)]


def test_stop_is_prompt_and_releases_nvml(seed_driver) -> None:
    watcher = HealthWatcher(enumerate_gpus(), lambda *a: None)
    watcher.start()
    assert nvml_refcount() == 1
    time.sleep(0.3)  # inside a wait
    start = time.monotonic()
    watcher.stop()
    assert time.monotonic() - start < 1.0
    assert nvml_refcount() == 0
    assert not any(t.name == "gpu-health" for t in threading.enumerate())
    watcher.stop()  # idempotent


def test_idle_watcher_uses_no_cpu(seed_driver, watch) -> None:
    watch(wait_timeout_ms=WAIT_TIMEOUT_MS)
    time.sleep(0.2)
    cpu = time.process_time()
    time.sleep(2.0)
    used = time.process_time() - cpu
    assert used < 0.1, f"an idle watcher used {used:.3f} s of CPU in 2 s"


def test_a_failing_callback_does_not_stop_the_watcher(seed_driver) -> None:
    changes = Changes()

    def flaky(uuid: str, healthy: bool, reason: str) -> None:
        changes(uuid, healthy, reason)
        if len(changes.calls) == 1:
            raise RuntimeError("boom")

    watcher = HealthWatcher(enumerate_gpus(), flaky)
    watcher.start()
    try:
        seed_driver.raise_xid(0, 79)
        assert changes.wait(1, timeout=1)
        seed_driver.raise_xid(1, 79)
        assert changes.wait(2, timeout=1)
    finally:
        watcher.stop()


def test_a_persistent_nvml_error_marks_gpus_unhealthy_without_spinning(seed_driver, caplog) -> None:
    import pynvml

    changes = Changes()
    watcher = HealthWatcher(enumerate_gpus(), changes, wait_timeout_ms=200)
    watcher.start()
    try:
        with caplog.at_level(logging.ERROR, logger="devplugin.gpu.health"):
            pynvml.nvmlShutdown()  # pulled from under the watcher: every wait now fails at once
            cpu = time.process_time()
            assert changes.wait(4, timeout=2)
            time.sleep(1.5)
            used = time.process_time() - cpu
        assert used < 0.2, f"{used:.3f} s of CPU in about 1.5 s"
        assert {(u, h) for u, h in changes.brief()} == {(seed_uuid(i), False) for i in range(4)}
        assert "waiting for NVML events failed (Uninitialized" in caplog.text
    finally:
        watcher.stop()


# ---- XIDs that need a GPU reset ----------------------------------------------------------------------------


def test_xids_that_need_a_reset_never_recover_by_waiting(make_driver, watch) -> None:
    reset_xids = sorted(DEFAULT_RESET_XIDS)
    driver = make_driver(seed_node(len(reset_xids) + 1))
    watcher, changes = watch(recovery_seconds=0.2)
    for gpu, xid in enumerate(reset_xids):
        driver.raise_xid(gpu, xid)
    transient_gpu = len(reset_xids)
    driver.raise_xid(transient_gpu, TRANSIENT_XID)
    assert changes.wait(len(reset_xids) + 2, timeout=3)  # every GPU unhealthy, then the transient one back
    time.sleep(1.0)  # five recovery windows
    assert changes.brief() == [(seed_uuid(g), False) for g in range(transient_gpu + 1)] + [
        (seed_uuid(transient_gpu), True)]
    assert watcher.unhealthy() == {seed_uuid(g) for g in range(len(reset_xids))}
    for gpu, xid in enumerate(reset_xids):
        reason = changes.calls[gpu][2]
        assert f"XID {xid}" in reason and "needs a GPU reset" in reason and f"nvidia-smi -r -i {gpu}" in reason


def test_a_custom_reset_list_is_honoured(seed_driver, watch) -> None:
    watcher, changes = watch(recovery_seconds=0.2, reset_xids=frozenset({TRANSIENT_XID}))
    seed_driver.raise_xid(0, TRANSIENT_XID)
    seed_driver.raise_xid(1, 79)  # not in the list given: recovers
    assert changes.wait(3, timeout=2)
    time.sleep(0.6)
    assert changes.brief() == [(seed_uuid(0), False), (seed_uuid(1), False), (seed_uuid(1), True)]
    assert watcher.unhealthy() == {seed_uuid(0)}


def test_a_transient_xid_does_not_downgrade_a_gpu_that_needs_a_reset(seed_driver, watch) -> None:
    watcher, changes = watch(recovery_seconds=0.2)
    seed_driver.raise_xid(2, 48)
    assert changes.wait(1, timeout=1)
    seed_driver.raise_xid(2, TRANSIENT_XID)
    time.sleep(0.8)
    assert changes.brief() == [(seed_uuid(2), False)]
    assert watcher.faults()[seed_uuid(2)].xid == 48


def test_the_operators_reset_marker_brings_the_gpu_back(seed_driver, watch, tmp_path) -> None:
    store = HealthStore(tmp_path / "state", boot_id="boot-1")
    watcher, changes = watch(recovery_seconds=0.2, store=store)
    seed_driver.raise_xid(1, 94)
    assert changes.wait(1, timeout=1)
    assert f"touch {store.reset_marker(seed_uuid(1))}" in changes.calls[0][2]
    assert not changes.wait(2, timeout=0.6)
    marker = store.reset_marker(seed_uuid(1))
    marker.parent.mkdir(parents=True)
    marker.touch()
    assert changes.wait(2, timeout=2)
    uuid, healthy, reason, _ = changes.calls[1]
    assert (uuid, healthy) == (seed_uuid(1), True)
    assert "reset confirmed" in reason and "XID 94" in reason
    assert not marker.exists()  # consumed: the next fault needs a new one
    assert store.load() == {}
    seed_driver.raise_xid(1, 94)
    assert changes.wait(3, timeout=1)
    assert not changes.wait(4, timeout=0.6)


def test_a_marker_is_refused_while_nvml_says_the_reset_is_still_pending(seed_driver, watch, tmp_path, monkeypatch,
                                                                        caplog) -> None:
    import pynvml

    pending = {"rows": (0, 1, 1, 0)}  # corrected, uncorrected, pending, failed
    monkeypatch.setattr(pynvml, "nvmlDeviceGetRemappedRows", lambda handle: pending["rows"])
    store = HealthStore(tmp_path / "state", boot_id="boot-1")
    watcher, changes = watch(recovery_seconds=0.2, store=store)
    seed_driver.raise_xid(0, 63)
    assert changes.wait(1, timeout=1)
    marker = store.reset_marker(seed_uuid(0))
    marker.parent.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="devplugin.gpu.health"):
        marker.touch()
        assert not changes.wait(2, timeout=1.0)
    assert "refused" in caplog.text and "row remapping pending" in caplog.text
    assert not marker.exists()
    pending["rows"] = (0, 1, 0, 0)  # the operator really reset it now
    marker.touch()
    assert changes.wait(2, timeout=2)
    assert changes.brief()[1] == (seed_uuid(0), True)


def test_non_finite_recovery_is_refused() -> None:
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(ValueError, match="recovery_seconds must be a finite number of seconds"):
            HealthWatcher([], lambda *a: None, recovery_seconds=bad)
