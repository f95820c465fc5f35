"""The fake apiserver, driven by the real kubernetes client: what the project's Kubernetes code relies on."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from devplugin_sim.fake_apiserver import FakeApiserver


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    with FakeApiserver(bookmark_interval_s=0.2) as fake:
        yield fake


@pytest.fixture
def v1(api: FakeApiserver) -> client.CoreV1Api:
    return client.CoreV1Api(api.client())


def _watch_lines(v1: client.CoreV1Api, rv: str, **kw: object) -> list[dict]:
    resp = v1.list_pod_for_all_namespaces(watch=True, resource_version=rv, _preload_content=False, **kw)
    try:
        return [json.loads(line) for line in iter_resp_lines(resp) if line]
    finally:
        resp.release_conn()


def test_list_with_field_and_label_selectors(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    api.add_pod(name="a", node_name="n1", labels={"app": "x"})
    api.add_pod(name="b", node_name="n2", labels={"app": "x"})
    api.add_pod(name="c", namespace="other", node_name="n1")
    api.add_pod(name="d", node_name="n1", phase="Succeeded")
    on_n1 = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert sorted(p.metadata.name for p in on_n1.items) == ["a", "c", "d"]
    live = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1,status.phase!=Succeeded")
    assert sorted(p.metadata.name for p in live.items) == ["a", "c"]
    assert [p.metadata.name for p in v1.list_namespaced_pod("default", label_selector="app=x").items] == ["a", "b"]
    assert [p.metadata.name for p in v1.list_namespaced_pod("other").items] == ["c"]
    pod = v1.read_namespaced_pod("a", "default")
    assert pod.metadata.uid and pod.metadata.creation_timestamp and pod.status.phase == "Pending"
    assert int(on_n1.metadata.resource_version) >= int(pod.metadata.resource_version)


def test_watch_streams_changes_and_selector_transitions(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    api.add_pod(name="a", node_name="n1")
    api.add_pod(name="unbound")
    rv = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").metadata.resource_version

    def changes() -> None:
        time.sleep(0.3)
        api.set_pod_phase("default", "a", "Running")
        v1.create_namespaced_pod_binding("unbound", "default", {"metadata": {"name": "unbound"},
                                                                "target": {"kind": "Node", "name": "n1"}},
                                         _preload_content=False)
        api.delete_pod("default", "a")

    threading.Thread(target=changes, daemon=True).start()
    lines = _watch_lines(v1, rv, field_selector="spec.nodeName=n1", allow_watch_bookmarks=True, timeout_seconds=2)
    seen = [(e["type"], e["object"]["metadata"].get("name")) for e in lines if e["type"] != "BOOKMARK"]
    assert seen == [("MODIFIED", "a"), ("ADDED", "unbound"), ("DELETED", "a")]
    bookmarks = [e for e in lines if e["type"] == "BOOKMARK"]
    assert bookmarks and int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) >= int(rv) + 3


def test_watch_from_compacted_version_is_410_then_relist_works(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    api.add_pod(name="a", node_name="n1")
    old_rv = v1.list_pod_for_all_namespaces().metadata.resource_version
    api.compact()
    lines = _watch_lines(v1, old_rv, timeout_seconds=2)
    assert [(e["type"], e["object"]["code"], e["object"]["reason"]) for e in lines] == [("ERROR", 410, "Expired")]
    fresh = v1.list_pod_for_all_namespaces()
    assert [p.metadata.name for p in fresh.items] == ["a"]
    api.add_pod(name="b", node_name="n1")
    lines = _watch_lines(v1, fresh.metadata.resource_version, timeout_seconds=1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "b")]


def test_patches_merge_strategic_and_json(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    api.add_node("n1", labels={"keep": "1", "drop": "1"}, capacity={"aliyun.com/gpu-mem": 80})
    node = v1.patch_node("n1", {"metadata": {"labels": {"drop": None, "new": "2"}}})  # strategic merge by default
    assert node.metadata.labels == {"keep": "1", "new": "2"}
    node = v1.patch_node("n1", {"metadata": {"annotations": {"a": "b"}}}, _content_type="application/merge-patch+json")
    assert node.metadata.annotations == {"a": "b"} and node.status.allocatable == {"aliyun.com/gpu-mem": "80"}
    api.add_pod(name="p", annotations={"x": "1"})
    pod = v1.patch_namespaced_pod("p", "default", [{"op": "replace", "path": "/metadata/annotations/x", "value": "2"},
                                                   {"op": "add", "path": "/metadata/annotations/a~1b", "value": "3"}])
    assert pod.metadata.annotations == {"x": "2", "a/b": "3"}
    assert api.pod("default", "p")["metadata"]["annotations"] == {"x": "2", "a/b": "3"}
    with pytest.raises(client.ApiException) as stale:
        v1.patch_namespaced_pod("p", "default", {"metadata": {"resourceVersion": "1", "labels": {"l": "v"}}})
    assert stale.value.status == 409
    with pytest.raises(client.ApiException) as other_pod:  # a uid in the patch is a precondition
        v1.patch_namespaced_pod("p", "default", {"metadata": {"uid": "not-this-pod", "labels": {"l": "v"}}})
    assert other_pod.value.status == 409 and "UID" in str(other_pod.value.body)
    with pytest.raises(client.ApiException) as missing:
        v1.patch_namespaced_pod("nope", "default", {"metadata": {"labels": {"l": "v"}}})
    assert missing.value.status == 404 and json.loads(missing.value.body)["reason"] == "NotFound"


def test_binding_sets_node_and_annotations_once(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    api.add_pod(name="p")
    body = {"metadata": {"name": "p", "annotations": {"gpushare.io/scheduled": "{}"}},
            "target": {"kind": "Node", "name": "n1"}}
    resp = v1.create_namespaced_binding("default", body, _preload_content=False)
    assert resp.status == 201
    pod = api.pod("default", "p")
    assert pod["spec"]["nodeName"] == "n1" and pod["metadata"]["annotations"]["gpushare.io/scheduled"] == "{}"
    with pytest.raises(client.ApiException) as again:
        v1.create_namespaced_pod_binding("p", "default", {**body, "target": {"kind": "Node", "name": "n2"}},
                                         _preload_content=False)
    assert again.value.status == 409 and "already assigned" in str(again.value.body)


def test_events_created_patched_and_listed(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    ev = v1.create_namespaced_event("default", {
        "metadata": {"generateName": "p."}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Placed", "message": "2 GiB of GPU 1", "type": "Normal", "count": 1})
    v1.patch_namespaced_event(ev.metadata.name, "default", {"count": 2})
    events_v1 = client.EventsV1Api(api.client())
    events_v1.create_namespaced_event("default", {
        "metadata": {"name": "e2"}, "eventTime": "2026-11-23T07:00:00.000000Z", "reason": "R", "action": "A",
        "reportingController": "c", "reportingInstance": "i"})
    assert [(e["reason"], e.get("count")) for e in api.events] == [("Placed", 2), ("R", None)]
    assert [e.reason for e in v1.list_namespaced_event("default").items] == ["Placed"]


def test_leases_create_get_replace(api: FakeApiserver) -> None:
    coord = client.CoordinationV1Api(api.client())
    coord.create_namespaced_lease("kube-system", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    lease = coord.read_namespaced_lease("l", "kube-system")
    lease.spec.holder_identity = "b"
    coord.replace_namespaced_lease("l", "kube-system", lease)
    assert coord.read_namespaced_lease("l", "kube-system").spec.holder_identity == "b"
    with pytest.raises(client.ApiException) as conflict:
        coord.replace_namespaced_lease("l", "kube-system", lease)  # its resourceVersion is now stale
    assert conflict.value.status == 409


@pytest.mark.parametrize("mode", ["refuse", "reset", "503"])
def test_down_then_up(api: FakeApiserver, v1: client.CoreV1Api, mode: str) -> None:
    api.add_node("n1")
    assert len(v1.list_node().items) == 1
    api.down(mode)
    t0 = time.monotonic()
    with pytest.raises(Exception) as failed:
        v1.list_node(_request_timeout=2)
    assert time.monotonic() - t0 < 2
    if mode == "503":
        assert isinstance(failed.value, client.ApiException) and failed.value.status == 503
    api.up()
    assert [n.metadata.name for n in v1.list_node().items] == ["n1"]


def test_down_cuts_open_watch(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    rv = v1.list_pod_for_all_namespaces().metadata.resource_version
    resp = v1.list_pod_for_all_namespaces(watch=True, resource_version=rv, _preload_content=False)

    def consume() -> None:
        try:
            list(iter_resp_lines(resp))
        except Exception:  # noqa: BLE001 - a cut stream raises urllib3's protocol error
            pass

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    reader.join(0.3)
    assert reader.is_alive()  # an idle watch stays open
    api.down()
    reader.join(5)
    assert not reader.is_alive()


def test_delay_and_request_log(api: FakeApiserver, v1: client.CoreV1Api) -> None:
    api.add_node("n1")
    api.delay(0.3)
    t0 = time.monotonic()
    v1.read_node("n1")
    assert time.monotonic() - t0 >= 0.3
    api.delay(0)
    v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    lists = api.requests_matching("GET", "/pods", watch=False)
    assert [r.query for r in lists] == [{"fieldSelector": "spec.nodeName=n1"}]
    assert api.requests_matching("GET", "/nodes/n1")[0].path == "/api/v1/nodes/n1"


def test_unknown_path_is_404_status(api: FakeApiserver) -> None:
    c = api.client()
    resp = c.rest_client.pool_manager.request("GET", api.url + "/api/v1/configmaps")
    assert resp.status == 404
    assert json.loads(resp.data)["kind"] == "Status" and json.loads(resp.data)["reason"] == "NotFound"
