"""The writer: annotations and Events reach the apiserver off the caller's path, survive an outage, coalesce,
aggregate, and a patch for a pod that is gone is dropped with a log line."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from devplugin.kube.client import load_api_client
from devplugin.kube.writer import COMPONENT, KubeWriter
from devplugin_sim.fake_apiserver import FakeApiserver

NODE = "gpu-node-1"


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver() as fake:
        fake.add_node(NODE)
        yield fake


@pytest.fixture
def writer(api: FakeApiserver) -> Iterator[KubeWriter]:
    w = KubeWriter(load_api_client(api.kubeconfig_path), NODE, backoff_start_s=0.05, backoff_max_s=0.3).start()
    yield w
    w.stop(flush_timeout_s=0.5)


def test_pod_annotations_merge_patch(api: FakeApiserver, writer: KubeWriter) -> None:
    pod = api.add_pod(name="p", node_name=NODE, annotations={"keep": "1", "drop": "1"})
    writer.patch_pod_annotations("default", "p", pod["metadata"]["uid"], {"gpushare.io/allocated": "{}", "drop": None})
    assert writer.flush(5)
    assert api.pod("default", "p")["metadata"]["annotations"] == {"keep": "1", "gpushare.io/allocated": "{}"}
    assert writer.pending() == 0


def test_node_annotations(api: FakeApiserver, writer: KubeWriter) -> None:
    writer.patch_node_annotations(NODE, {"gpushare.io/gpus": '{"version":1}'})
    assert writer.flush(5)
    assert api.node(NODE)["metadata"]["annotations"]["gpushare.io/gpus"] == '{"version":1}'


def test_callers_never_wait_and_writes_arrive_after_an_outage(api: FakeApiserver, writer: KubeWriter) -> None:
    pod = api.add_pod(name="p", node_name=NODE)
    uid = pod["metadata"]["uid"]
    api.down()
    t0 = time.monotonic()
    writer.patch_pod_annotations("default", "p", uid, {"a": "1"})
    writer.patch_pod_annotations("default", "p", uid, {"b": "2"})
    writer.pod_event("default", "p", uid, "Normal", "GpuPlaced", "2 GiB of GPU 1")
    writer.node_event(NODE, "Warning", "RelabelPending", "mode change waits for 3 containers")
    assert time.monotonic() - t0 < 0.5  # queued, not sent
    assert not writer.flush(0.8)  # the apiserver is down: nothing can be delivered
    assert writer.pending() >= 2 and writer.failures > 0
    writer.patch_pod_annotations("default", "p", uid, {"a": "3"})
    api.up()
    assert writer.flush(10)
    assert api.pod("default", "p")["metadata"]["annotations"] == {"a": "3", "b": "2"}
    patches = api.requests_matching("PATCH", "/pods/p")
    assert len(patches) == 1  # three patches of one pod went out as one
    assert sorted(e["reason"] for e in api.events) == ["GpuPlaced", "RelabelPending"]


def test_a_slow_apiserver_does_not_slow_the_caller(api: FakeApiserver, writer: KubeWriter) -> None:
    pod = api.add_pod(name="p", node_name=NODE)
    api.delay(1.5)
    t0 = time.monotonic()
    for i in range(5):
        writer.patch_pod_annotations("default", "p", pod["metadata"]["uid"], {f"k{i}": "v"})
        writer.pod_event("default", "p", pod["metadata"]["uid"], "Normal", "GpuPlaced", f"container {i}")
    assert time.monotonic() - t0 < 0.5
    api.delay(0)
    assert writer.flush(10)
    assert len(api.pod("default", "p")["metadata"]["annotations"]) == 5 and len(api.events) == 5


def test_event_fields(api: FakeApiserver, writer: KubeWriter) -> None:
    pod = api.add_pod(name="p", node_name=NODE)
    writer.pod_event("default", "p", pod["metadata"]["uid"], "Warning", "GpuRefused", "too big for any GPU")
    writer.node_event(NODE, "Normal", "GpuInventory", "8 GPUs")
    assert writer.flush(5)
    by_reason = {e["reason"]: e for e in api.events}
    ev = by_reason["GpuRefused"]
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "p",
                                    "uid": pod["metadata"]["uid"]}
    assert ev["type"] == "Warning" and ev["message"] == "too big for any GPU" and ev["count"] == 1
    assert ev["source"] == {"component": COMPONENT, "host": NODE}
    assert ev["reportingComponent"] == COMPONENT and ev["reportingInstance"] == NODE
    assert ev["firstTimestamp"] and ev["lastTimestamp"] and ev["metadata"]["namespace"] == "default"
    node_ev = by_reason["GpuInventory"]
    assert node_ev["involvedObject"]["kind"] == "Node" and node_ev["involvedObject"]["name"] == NODE


def test_repeats_aggregate_into_one_event(api: FakeApiserver, writer: KubeWriter) -> None:
    pod = api.add_pod(name="p", node_name=NODE)
    uid = pod["metadata"]["uid"]
    for _ in range(3):
        writer.pod_event("default", "p", uid, "Warning", "GpuRefused", "too big for any GPU")
    assert writer.flush(5)
    writer.pod_event("default", "p", uid, "Warning", "GpuRefused", "too big for any GPU")
    writer.pod_event("default", "p", uid, "Warning", "GpuRefused", "core is not a multiple of 5")
    assert writer.flush(5)
    counts = sorted((e["message"], e["count"]) for e in api.events)
    assert counts == [("core is not a multiple of 5", 1), ("too big for any GPU", 4)]


def test_patch_of_deleted_pod_is_dropped_with_a_log(api: FakeApiserver, writer: KubeWriter,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    pod = api.add_pod(name="p", node_name=NODE)
    api.delete_pod("default", "p")
    with caplog.at_level(logging.INFO, logger="devplugin.kube.writer"):
        writer.patch_pod_annotations("default", "p", pod["metadata"]["uid"], {"a": "1"})
        assert writer.flush(5)
    assert writer.pending() == 0
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert dropped and dropped[0].fields["pod"] == "default/p"


def test_patch_of_replaced_pod_is_dropped(api: FakeApiserver, writer: KubeWriter,
                                          caplog: pytest.LogCaptureFixture) -> None:
    old = api.add_pod(name="p", node_name=NODE)
    api.delete_pod("default", "p")
    api.add_pod(name="p", node_name=NODE)  # same name, new uid
    with caplog.at_level(logging.INFO, logger="devplugin.kube.writer"):
        writer.patch_pod_annotations("default", "p", old["metadata"]["uid"], {"a": "1"})
        assert writer.flush(5)
    assert api.pod("default", "p")["metadata"]["annotations"] == {}
    assert any("replaced" in r.getMessage() for r in caplog.records)


def test_bad_event_type_is_refused_at_once(writer: KubeWriter) -> None:
    with pytest.raises(ValueError, match="Normal"):
        writer.node_event(NODE, "Error", "X", "y")


def test_writes_reuse_one_connection(api: FakeApiserver, writer: KubeWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each answer is read to its end, so its connection goes back to the pool: a node's stream of patches and
    Events is not a TCP (and, to a real apiserver, TLS) handshake per write, which a loaded apiserver pays for and
    logs as a broken pipe when the unread answer's connection is dropped."""
    import urllib3.connection

    opened = []
    connect = urllib3.connection.HTTPConnection.connect

    def counted(self: urllib3.connection.HTTPConnection) -> None:
        opened.append(self)
        connect(self)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", counted)
    pod = api.add_pod(name="p", node_name=NODE)
    for i in range(10):
        writer.patch_node_annotations(NODE, {"gpushare.io/gpu-usage": str(i)})
        writer.patch_pod_annotations("default", "p", pod["metadata"]["uid"], {"n": str(i)})
        writer.pod_event("default", "p", pod["metadata"]["uid"], "Normal", "GPUAssigned", f"call {i}")
        assert writer.flush(5)
    assert writer.errors == 0
    assert len(opened) <= 1, f"{len(opened)} connections opened for 30 writes"
