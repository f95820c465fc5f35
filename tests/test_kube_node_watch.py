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
