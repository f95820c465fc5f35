"""A tenant's annotations cannot stop the node daemon or steal another pod's identity: the real daemon, the kubelet
emulator and the fake apiserver (the real `kubernetes` client)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from devplugin import contract as c
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.support.daemon_harness import Running, _until, running


def events(r: Running, name: str, reason: str) -> list[dict]:
    assert r.api is not None
    r.nd.link.writer.flush(5)  # type: ignore[union-attr]
    return [e for e in r.api.events if e.get("involvedObject", {}).get("name") == name and e.get("reason") == reason]


def record(r: Running, name: str) -> dict:
    assert r.api is not None
    r.nd.link.writer.flush(5)  # type: ignore[union-attr]
    raw = (r.api.pod("default", name)["metadata"].get("annotations") or {}).get(c.ANN_ALLOCATED)
    return json.loads(raw) if raw else {}


def healthz(r: Running) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(r.http_url + "/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def r(api: FakeApiserver) -> Iterator[Running]:
    with running(apiserver=api, health_port=0) as run:
        assert run.registered_all()
        yield run


def test_a_pod_created_with_its_own_record_is_placed_as_itself(r: Running) -> None:
    """A record the pod was created with does not name the pod's UID: the daemon does not take it for its own, so
    the forger's admission is not named after another tenant's pending pod of the same size."""
    gpu = r.nd.node.gpus[3]
    forged = c.PodAssignment(node=r.node_name, time_ns=1, containers={
        "main": (c.GpuShare(index=3, uuid=gpu.uuid, mem=2, core=0),)}, uid="guessed").render()
    forger = r.pod("forger", mem=2, annotations={c.ANN_ALLOCATED: forged}, created="2026-01-01T00:00:00Z")
    victim = r.pod("victim", mem=2, created="2026-01-01T00:00:01Z")
    assert r.wait_cached(forger) and r.wait_cached(victim)
    got = r.admit(forger).containers[0]
    assert _until(lambda: record(r, "forger").get("uid") == forger["metadata"]["uid"], 5), record(r, "forger")
    rec = record(r, "forger")
    assert rec["containers"]["main"][0]["uuid"] == got.envs["NVIDIA_VISIBLE_DEVICES"]
    assert not events(r, "victim", "GPUAssigned")
    assert c.ANN_ALLOCATED not in r.api.pod("default", "victim")["metadata"].get("annotations", {})  # type: ignore[union-attr]
    [warn] = events(r, "forger", "GPURecordReplaced")
    assert "not written by the node daemon for this pod" in warn["message"]


@pytest.mark.parametrize("junk", ['{"time": 1e999}', '{"containers": {"main": [{"index": 0, "mem": -15}]}}',
                                  '{"containers": {"main": [{"index": "\u00b2"}]}}', "[" * 5000])
def test_a_running_pod_with_a_hostile_record_does_not_stop_a_restarted_daemon(r: Running, junk: str) -> None:
    pod = r.pod("hostile", mem=2)
    assert r.wait_cached(pod)
    r.admit(pod)
    assert record(r, "hostile")["uid"] == pod["metadata"]["uid"]
    r.api.patch_pod("default", "hostile", {"metadata": {"annotations": {c.ANN_ALLOCATED: junk}}})  # type: ignore[union-attr]
    assert _until(lambda: r.nd.link.pods.get(pod["metadata"]["uid"]).annotations.get(c.ANN_ALLOCATED) == junk, 5)  # type: ignore[union-attr]
    r.restart_daemon()
    assert r.registered_all()
    assert healthz(r) == (200, "ok\n")
    assert _until(lambda: bool(events(r, "hostile", "GPURecordReplaced")), 5)
    [warn] = events(r, "hostile", "GPURecordReplaced")
    assert f"annotation {c.ANN_ALLOCATED}" in warn["message"] and warn["type"] == "Warning"
    assert _until(lambda: record(r, "hostile").get("uid") == pod["metadata"]["uid"], 5)  # the daemon's record is back


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_registration_worker_fails_the_liveness_probe(r: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    class Killed(BaseException):
        pass

    def die() -> None:
        raise Killed

    assert healthz(r) == (200, "ok\n")
    monkeypatch.setattr(r.daemon, "reconcile", die)
    r.daemon.poke()
    assert _until(lambda: healthz(r)[0] == 503, 5)
    assert healthz(r) == (503, "the kubelet registration worker thread has died\n")


def test_a_failing_registration_round_is_retried_not_fatal(r: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    real = r.daemon.reconcile
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OverflowError("cannot convert float infinity to integer")
        real()

    monkeypatch.setattr(r.daemon, "reconcile", flaky)
    r.daemon._registered_with.clear()  # as after a kubelet restart
    r.daemon.poke()
    assert _until(lambda: len(calls) >= 2, 10)
    assert r.registered_all() and healthz(r) == (200, "ok\n")


def test_an_older_pod_is_not_named_after_a_younger_one_with_a_scheduler_choice(r: Running) -> None:
    """The kubelet admits the older pod first; the younger one's scheduler choice must not make the daemon name the
    older pod's devices after it (when the younger ended, the older's devices would be dropped)."""
    gpu = r.nd.node.gpus[2]
    old = r.pod("old", mem=3, created="2026-01-01T00:00:00Z")
    assert r.wait_cached(old)
    choice = c.PodAssignment(node=r.node_name, time_ns=1, containers={
        "main": (c.GpuShare(index=2, uuid=gpu.uuid, mem=3, core=0),)}).render()
    young = r.pod("young", mem=3, annotations={c.ANN_SCHEDULED: choice}, created="2026-01-01T00:00:05Z")
    assert r.wait_cached(young)
    got_old = r.admit(old).containers[0]  # type: ignore[attr-defined]
    assert _until(lambda: record(r, "old").get("uid") == old["metadata"]["uid"], 5)
    assert c.ANN_ALLOCATED not in r.api.pod("default", "young")["metadata"].get("annotations", {})  # type: ignore[union-attr]
    got_young = r.admit(young).containers[0]  # type: ignore[attr-defined]
    assert got_young.envs["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid  # the choice is honoured for the pod it names

    def held_by(uid: str) -> set[str]:
        return {g for h in r.nd.allocator.holdings.holders() if h.key is not None and h.key.pod_uid == uid
                for g in h.gpus()}

    assert held_by(old["metadata"]["uid"]) == {got_old.envs["NVIDIA_VISIBLE_DEVICES"]}
    r.api.set_pod_phase("default", "young", "Succeeded")  # type: ignore[union-attr]
    assert _until(lambda: not held_by(young["metadata"]["uid"]), 5)
    assert held_by(old["metadata"]["uid"]) == {got_old.envs["NVIDIA_VISIBLE_DEVICES"]}  # the older pod keeps its GPU
