"""The pod cache against the fake apiserver, through the real kubernetes client: it follows the node's pods,
relists on 410, rides out an apiserver outage, and fetch_now stays within its budget."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from devplugin.allocation.requests import PodRequest
from devplugin.kube.client import load_api_client
from devplugin.kube.pod_cache import PodCache
from devplugin_sim.fake_apiserver import FakeApiserver

NODE = "gpu-node-1"
MEM = "aliyun.com/gpu-mem"


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver(bookmark_interval_s=0.2) as fake:
        fake.add_node(NODE)
        yield fake


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, kind: str, pod: PodRequest) -> None:
        with self.lock:
            self.events.append((kind, pod.name, pod.phase))

    def names(self, kind: str) -> list[str]:
        with self.lock:
            return [name for k, name, _ in self.events if k == kind]


@pytest.fixture
def cache(api: FakeApiserver) -> Iterator[PodCache]:
    c = PodCache(load_api_client(api.kubeconfig_path), NODE, backoff_start_s=0.05, backoff_max_s=0.4,
                 healthy_silence_s=0.5)
    yield c
    c.stop()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def names(cache: PodCache) -> list[str]:
    return sorted(p.name for p in cache.pods())


def test_follows_pods_bound_to_this_node(api: FakeApiserver, cache: PodCache) -> None:
    api.add_pod(name="mine", node_name=NODE, limits={MEM: 2})
    api.add_pod(name="elsewhere", node_name="other-node", limits={MEM: 2})
    rec = Recorder()
    cache.add_listener(rec)
    cache.start()
    assert cache.synced.wait(10)
    assert names(cache) == ["mine"]
    mine = cache.pods()[0]
    assert mine.containers[0].mem == 2 and cache.get(mine.uid) == mine

    api.add_pod(name="pending")  # not bound yet: not this node's
    api.patch_pod("default", "pending", {"spec": {"nodeName": NODE}, "metadata": {"annotations": {"a": "1"}}})
    assert wait_for(lambda: names(cache) == ["mine", "pending"])
    assert cache.get(api.pod("default", "pending")["metadata"]["uid"]).annotations == {"a": "1"}
    api.set_pod_phase("default", "mine", "Succeeded")
    assert wait_for(lambda: cache.get(mine.uid).finished)
    api.delete_pod("default", "mine")
    assert wait_for(lambda: names(cache) == ["pending"])
    assert rec.names("ADDED") == ["mine", "pending"]
    assert rec.names("DELETED") == ["mine"]
    assert ("MODIFIED", "mine", "Succeeded") in rec.events
    assert cache.healthy()


def test_relists_after_410(api: FakeApiserver, cache: PodCache) -> None:
    api.add_pod(name="a", node_name=NODE)
    rec = Recorder()
    cache.add_listener(rec)
    cache.start()
    assert cache.synced.wait(10)
    lists_before = len(api.requests_matching("GET", "/pods", watch=False))
    api.compact()  # the open watch gets 410 and its resourceVersion is now too old
    api.add_pod(name="b", node_name=NODE)
    api.delete_pod("default", "a")
    assert wait_for(lambda: names(cache) == ["b"])
    assert len(api.requests_matching("GET", "/pods", watch=False)) == lists_before + 1
    assert rec.names("ADDED") == ["a", "b"] and rec.names("DELETED") == ["a"]


@pytest.mark.parametrize("mode", ["refuse", "503"])
def test_survives_apiserver_outage_and_catches_up(api: FakeApiserver, cache: PodCache, mode: str) -> None:
    api.add_pod(name="a", node_name=NODE)
    api.add_pod(name="b", node_name=NODE)
    rec = Recorder()
    cache.add_listener(rec)
    cache.start()
    assert cache.synced.wait(10)
    api.down(mode)
    api.add_pod(name="c", node_name=NODE)  # changes the cache cannot see while the apiserver is down
    api.delete_pod("default", "a")
    time.sleep(1.0)
    assert names(cache) == ["a", "b"]  # the last known state stays readable
    assert not cache.healthy()
    api.up()
    assert wait_for(lambda: names(cache) == ["b", "c"])
    assert wait_for(cache.healthy)
    assert rec.names("DELETED") == ["a"] and rec.names("ADDED") == ["a", "b", "c"]


def test_fetch_now_reads_a_pod_the_cache_has_not_seen(api: FakeApiserver, cache: PodCache) -> None:
    rec = Recorder()
    cache.add_listener(rec)  # the cache is not started: only fetch_now can fill it
    api.add_pod(name="just-bound", node_name=NODE, limits={MEM: 4})
    t0 = time.monotonic()
    pods = cache.fetch_now(2.0)
    assert pods is not None and [p.name for p in pods] == ["just-bound"]
    assert time.monotonic() - t0 < 2.0
    assert names(cache) == ["just-bound"] and rec.names("ADDED") == ["just-bound"]
    assert api.requests_matching("GET", "/pods")[0].query == {"fieldSelector": f"spec.nodeName={NODE}"}


def test_fetch_now_does_not_wait_for_listeners(api: FakeApiserver, cache: PodCache) -> None:
    """A listener that waits (say, for the allocator's lock, held by the admission that called fetch_now) must
    not hold up the answer."""
    release = threading.Event()
    heard: list[str] = []

    def slow_listener(kind: str, pod: PodRequest) -> None:
        release.wait(5)
        heard.append(pod.name)

    cache.add_listener(slow_listener)
    api.add_pod(name="just-bound", node_name=NODE)
    t0 = time.monotonic()
    pods = cache.fetch_now(1.0)
    assert pods is not None and [p.name for p in pods] == ["just-bound"]
    assert time.monotonic() - t0 < 1.0 and heard == []
    release.set()
    assert wait_for(lambda: heard == ["just-bound"])


@pytest.mark.parametrize("fault", ["refuse", "reset", "slow"])
def test_fetch_now_is_bounded_by_its_budget(api: FakeApiserver, cache: PodCache, fault: str) -> None:
    api.add_pod(name="p", node_name=NODE)
    if fault == "slow":
        api.delay(2.0)
    else:
        api.down(fault)
    t0 = time.monotonic()
    assert cache.fetch_now(0.3) is None
    assert time.monotonic() - t0 < 0.6  # the budget, plus scheduling slack on a loaded machine
    api.delay(0)
    api.up()
    assert wait_for(lambda: cache.fetch_now(1.0) is not None)


def test_stale_events_do_not_undo_newer_news(api: FakeApiserver, cache: PodCache) -> None:
    pod = api.add_pod(name="p", node_name=NODE)
    newer = api.patch_pod("default", "p", {"metadata": {"annotations": {"seen": "new"}}})
    assert cache.fetch_now(2.0) is not None  # a direct LIST ran ahead of the watch
    cache._on_event("MODIFIED", pod)  # the watch then replays the older version
    assert cache.get(pod["metadata"]["uid"]).annotations == {"seen": "new"}
    gone = api.delete_pod("default", "p")
    cache._on_event("DELETED", gone)
    cache._on_event("ADDED", newer)  # a late event of the deleted pod does not bring it back
    assert cache.pods() == []


def test_unreadable_request_is_reported(api: FakeApiserver, cache: PodCache, caplog: pytest.LogCaptureFixture) -> None:
    api.add_pod(name="half", node_name=NODE, limits={MEM: "1.5"})
    api.add_pod(name="ok", node_name=NODE, limits={MEM: 1})
    with caplog.at_level(logging.WARNING, logger="devplugin.kube.pod_cache"):
        assert cache.fetch_now(2.0) is not None
    assert names(cache) == ["ok"]
    assert "whole number" in cache.invalid()["default/half"]
    assert any(getattr(r, "fields", {}).get("pod") == "default/half" for r in caplog.records)


def test_needs_a_node_name(api: FakeApiserver) -> None:
    with pytest.raises(ValueError, match="NODE_NAME"):
        PodCache(load_api_client(api.kubeconfig_path), "")
