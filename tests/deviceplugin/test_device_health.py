"""XID events turn a GPU's devices Unhealthy in ListAndWatch, and a GPU that recovers turns Healthy again."""

from __future__ import annotations

from tests.support.daemon_harness import CORE, COUNT, MEM, running


def test_xid_marks_unhealthy_then_recovers() -> None:
    with running(recovery_seconds=0.5) as r:
        assert r.registered_all()
        r.driver.raise_xid(2, 8)  # transient (XIDs that need a reset: tests/gpu/test_health_persist.py)
        degraded = {MEM: 45, CORE: 300, COUNT: 3}  # three streams, each updated on its own
        assert r.kubelet.wait_for(lambda k: k.allocatable() == degraded, timeout=5)
        assert r.kubelet.capacity() == {MEM: 60, CORE: 400, COUNT: 4}
        gpu2 = r.daemon.node.gpus[2].uuid
        assert all(h == "Unhealthy" for i, h in r.kubelet.devices(MEM).items() if i.startswith(gpu2))
        assert r.kubelet.wait_for(lambda k: k.allocatable() == {MEM: 60, CORE: 400, COUNT: 4}, timeout=5)


def test_ignored_xid_changes_nothing() -> None:
    with running() as r:
        assert r.registered_all()
        r.driver.raise_xid(1, 43)
        r.driver.raise_xid(0, 79)  # a later critical one proves the ignored one was processed first
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 45, timeout=5)
        gpu1 = r.daemon.node.gpus[1].uuid
        assert all(h == "Healthy" for i, h in r.kubelet.devices(MEM).items() if i.startswith(gpu1))


def test_lost_gpu_stays_unhealthy_until_it_answers_again() -> None:
    with running(recovery_seconds=0.3) as r:
        assert r.registered_all()
        r.driver.set_lost(3, True)
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 45, timeout=5)
        assert not r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 60, timeout=1.0)
        r.driver.set_lost(3, False)
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 60, timeout=5)
