"""The node watch: the daemon hears this node's labels at start and on every relabel, through outages and 410s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from devplugin.kube.client import load_api_client
from devplugin.kube.node_watch import NodeWatch
from devplugin_sim.fake_apiserver import FakeApiserver

NODE = "gpu-node-1"
MODE = "ack.node.gpu.schedule"


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver(bookmark_interval_s=0.2) as fake:
        fake.add_node(NODE, labels={MODE: "core_mem"})
        fake.add_node("other-node", labels={MODE: "share"})
        yield fake


@pytest.fixture
def heard() -> list[dict[str, str]]:
    return []


@pytest.fixture
def watch(api: FakeApiserver, heard: list[dict[str, str]]) -> Iterator[NodeWatch]:
    lock = threading.Lock()

    def on_labels(labels: dict[str, str]) -> None:
        with lock:
            heard.append(labels)

    w = NodeWatch(load_api_client(api.kubeconfig_path), NODE, on_labels, backoff_start_s=0.05, backoff_max_s=0.4)
    w.start()
    assert w.synced.wait(10)
    yield w
    w.stop()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_labels_at_start_and_on_relabel_only(api: FakeApiserver, watch: NodeWatch,
                                            heard: list[dict[str, str]]) -> None:
    assert heard == [{MODE: "core_mem"}] and watch.labels() == {MODE: "core_mem"}
    api.patch_node(NODE, {"metadata": {"annotations": {"x": "1"}}})  # not a label change
    api.patch_node("other-node", {"metadata": {"labels": {MODE: "cgpu"}}})  # not this node
    api.patch_node(NODE, {"metadata": {"labels": {MODE: "share"}}})
    assert wait_for(lambda: len(heard) == 2)
    assert heard[1] == {MODE: "share"}
    assert watch.node()["metadata"]["annotations"] == {"x": "1"}
    time.sleep(0.3)
    assert len(heard) == 2 and watch.healthy()


def test_relabel_during_outage_and_after_410(api: FakeApiserver, watch: NodeWatch,
                                             heard: list[dict[str, str]]) -> None:
    api.down()
    api.patch_node(NODE, {"metadata": {"labels": {MODE: "cgpu"}}})
    time.sleep(0.5)
    assert watch.labels() == {MODE: "core_mem"}
    api.up()
    assert wait_for(lambda: watch.labels() == {MODE: "cgpu"})
    api.compact()
    api.patch_node(NODE, {"metadata": {"labels": {"ack.node.gpu.placement": "spread"}}})
    assert wait_for(lambda: (watch.labels() or {}).get("ack.node.gpu.placement") == "spread")
    assert [h.get(MODE) for h in heard] == ["core_mem", "cgpu", "cgpu"]


def test_needs_a_node_name(api: FakeApiserver) -> None:
    with pytest.raises(ValueError, match="NODE_NAME"):
        NodeWatch(load_api_client(api.kubeconfig_path), "", lambda labels: None)


def test_a_recreated_node_object_gets_the_daemons_inventory_back() -> None:
    # The Node object is deleted and created again (a node re-registering, `kubectl delete node`): the new object
    # has none of the daemon's annotations; the watch sees the new UID and the daemon publishes them again.
    from devplugin import contract as c
    from tests.support.daemon_harness import running

    with FakeApiserver(bookmark_interval_s=0.2) as api, running(apiserver=api) as r:
        assert r.nd.reporter is not None
        reporter, board = r.nd.reporter, r.nd.board
        p = r.pod("u", mem=5, core=25)
        assert r.wait_cached(p) and r.registered_all()
        r.admit(p)

        def usage_mem() -> int:
            raw = api.node("gpu-node")["metadata"]["annotations"].get(c.ANN_NODE_USAGE)
            return c.parse_usage(raw).gpus[0].mem if raw else -1

        assert wait_for(lambda: usage_mem() == 5)
        recreated = threading.Event()

        def republish() -> None:
            reporter.republish(board.is_healthy)
            recreated.set()

        w = NodeWatch(load_api_client(api.kubeconfig_path), "gpu-node", lambda labels: None, on_recreated=republish,
                      backoff_start_s=0.05, backoff_max_s=0.4).start()
        try:
            assert w.synced.wait(10)
            api.patch_node("gpu-node", {"metadata": {"labels": {"x": "1"}}})  # an update is not a re-creation
            assert wait_for(lambda: (w.labels() or {}).get("x") == "1")
            assert not recreated.is_set()
            api.delete_node("gpu-node")
            api.add_node("gpu-node", labels={MODE: "core_mem"})
            assert recreated.wait(10)
            assert wait_for(lambda: usage_mem() == 5)  # the room in use, as before
            inv = c.parse_inventory(api.node("gpu-node")["metadata"]["annotations"][c.ANN_NODE_GPUS])
            assert len(inv.gpus) == 4
        finally:
            w.stop()
