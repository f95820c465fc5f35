"""The HTTP layer: kube-scheduler's and the apiserver's JSON in and out, 400 for every malformed or oversized
body (fuzzed), health, readiness and the OpenAPI document."""

from __future__ import annotations

import base64
import json
import warnings

import jsonpatch
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # Starlette's note about the HTTP library under its test client
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster, held
from tests.support.scheduler_objects import node, pod

PATHS = ("/scheduler/filter", "/scheduler/prioritize", "/scheduler/preempt", "/scheduler/bind", "/admission/validate",
         "/admission/mutate")


@pytest.fixture()
def state() -> ClusterState:
    s = ClusterState()
    s.replace_nodes([node("n1", gpus=4, units=15), node("n2", gpus=2, units=24)])
    s.replace_pods([held(1, 20, node_name="n2")])
    return s


@pytest.fixture()
def http(state: ClusterState) -> TestClient:
    return TestClient(build_app(Service(state, FakeCluster(state), max_body=64 * 1024)))


def review(obj: dict, op: str = "CREATE") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "req-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
                        "operation": op, "userInfo": {"username": "me"}, "object": obj, "dryRun": False}}


def test_filter_answers_kube_schedulers_shape(http: TestClient) -> None:
    r = http.post("/scheduler/filter", json={"Pod": pod(mem=20), "Nodes": None, "NodeNames": ["n1", "n2"]})
    assert r.status_code == 200
    body = r.json()
    assert body["NodeNames"] == ["n2"]
    assert body["FailedNodes"] == {"n1": "GPU 0..3: at most 15 GiB free on one GPU, 20 GiB asked"}
    assert body["FailedAndUnresolvableNodes"] == {} and body["Error"] == "" and "Nodes" not in body


def test_filter_with_full_nodes_answers_nodes(http: TestClient) -> None:
    r = http.post("/scheduler/filter", json={"Pod": pod(mem=20), "Nodes": {"items": [node("n1"), node("n2")]}})
    body = r.json()
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["n2"]
    assert body["Nodes"]["items"][0]["metadata"]["annotations"]  # the node object comes back whole


def test_prioritize_is_a_bare_list_of_host_scores(http: TestClient) -> None:
    r = http.post("/scheduler/prioritize", json={"Pod": pod(mem=4), "NodeNames": ["n1", "n2"]})
    assert r.status_code == 200
    assert r.json() == [{"Host": "n1", "Score": 1}, {"Host": "n2", "Score": 5}]  # 4/60, 24/48


def test_bind_answers_error_in_the_body(http: TestClient, state: ClusterState) -> None:
    state.upsert_pod(p := pod("x", mem=4))
    uid = p["metadata"]["uid"]
    assert http.post("/scheduler/filter", json={"Pod": p, "NodeNames": ["n1"]}).json()["NodeNames"] == ["n1"]
    ok = http.post("/scheduler/bind", json={"PodName": "x", "PodNamespace": "default", "PodUID": uid, "Node": "n1"})
    assert ok.status_code == 200 and ok.json() == {"Error": ""}
    again = http.post("/scheduler/bind", json={"PodName": "y", "PodNamespace": "default", "PodUID": "u",
                                               "Node": "n1"})
    assert again.status_code == 200 and "reading pod default/y failed" in again.json()["Error"]


def test_validating_webhook_denies_with_the_reason_and_echoes_the_uid(http: TestClient) -> None:
    r = http.post("/admission/validate", json=review(pod(mem=2, core=33)))
    assert r.status_code == 200
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == "req-1" and body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 403
    assert "ask for a multiple of 5" in body["response"]["status"]["message"]
    ok = http.post("/admission/validate", json=review(pod(mem=2, core=30))).json()
    assert ok["response"] == {"uid": "req-1", "allowed": True}
    too_big = http.post("/admission/validate", json=review(pod(mem=30))).json()["response"]
    assert "largest GPU in the cluster has 24" in too_big["status"]["message"]


def test_mutating_webhook_returns_a_json_patch(http: TestClient) -> None:
    p = pod()
    resp = http.post("/admission/mutate", json=review(p)).json()["response"]
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    patched = jsonpatch.JsonPatch(json.loads(base64.b64decode(resp["patch"]))).apply(p)
    assert patched["spec"]["containers"][0]["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    gpu = http.post("/admission/mutate", json=review(pod(mem=2))).json()["response"]
    assert "patch" not in gpu and gpu["allowed"] is True
    other_kind = review({"metadata": {"name": "cm"}})
    other_kind["request"]["kind"]["kind"] = "ConfigMap"
    assert http.post("/admission/mutate", json=other_kind).json()["response"]["allowed"] is True


@pytest.mark.parametrize(("path", "body", "reason"), [
    ("/scheduler/filter", b"", "empty body"),
    ("/scheduler/filter", b"{not json", "Invalid JSON"),
    ("/scheduler/filter", b"[]", "body is not a valid ExtenderArgs"),
    ("/scheduler/filter", json.dumps({"NodeNames": ["n1"]}).encode(), "Pod: Field required"),
    ("/scheduler/filter", json.dumps({"Pod": {"metadata": {}, "spec": {"containers": "x"}}}).encode(),
     "Pod.spec.containers"),
    ("/scheduler/prioritize", json.dumps({"Pod": pod(), "NodeNames": "n1"}).encode(), "NodeNames"),
    ("/scheduler/bind", json.dumps({"PodName": "x", "Node": "n1"}).encode(), "PodNamespace: Field required"),
    ("/admission/validate", json.dumps({"kind": "AdmissionReview"}).encode(), "apiVersion: Field required"),
    ("/admission/validate", json.dumps({**review(pod()), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
     "apiVersion: Input should be 'admission.k8s.io/v1'"),
    ("/admission/mutate", json.dumps(review({"spec": {}})).encode(), "request.object is not a Pod"),
])
def test_malformed_bodies_get_400_with_the_reason(http: TestClient, path: str, body: bytes, reason: str) -> None:
    r = http.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert reason in r.json()["error"]


def test_oversized_bodies_get_413(http: TestClient) -> None:
    big = json.dumps({"Pod": pod(), "NodeNames": ["n" * 100] * 1000}).encode()
    r = http.post("/scheduler/filter", content=big)
    assert r.status_code == 413 and "exceeds the limit of 65536 bytes" in r.json()["error"]

    def chunks():  # no Content-Length: counted while streaming
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    r = http.post("/scheduler/filter", content=chunks())
    assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["Pod", "NodeNames", "Nodes", "metadata", "spec", "containers", "name", "resources",
                         "limits", "aliyun.com/gpu-mem", "request", "uid", "object", "apiVersion", "kind",
                         "PodName", "PodNamespace", "Node", "items", "labels", "annotations"]) | st.text(max_size=5),
        children, max_size=5),
    max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), doc=json_values)
def test_no_input_crashes_the_service(http: TestClient, path: str, doc: object) -> None:
    r = http.post(path, content=json.dumps(doc).encode())
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limits=st.dictionaries(st.sampled_from(["aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage",
                                               "aliyun.com/gpu-count"]),
                              st.integers(-5, 300) | st.text(max_size=4), max_size=3),
       labels=st.dictionaries(st.just("aliyun.com/gpu-count"), st.text(max_size=3), max_size=1))
@example(limits={"aliyun.com/gpu-mem": "\u00b9"}, labels={})  # str.isdigit() takes it, int() does not
@example(limits={"aliyun.com/gpu-mem": "2"}, labels={"aliyun.com/gpu-count": "\u00b2"})
@example(limits={"aliyun.com/gpu-mem": "1e1", "aliyun.com/gpu-count": "1e999"}, labels={})
def test_any_resource_values_get_an_answer(http: TestClient, limits: dict, labels: dict) -> None:
    p = pod(labels=labels)
    p["spec"]["containers"][0]["resources"] = {"limits": limits}
    for path, body in (("/scheduler/filter", {"Pod": p, "NodeNames": ["n1", "n2"]}),
                       ("/scheduler/prioritize", {"Pod": p, "NodeNames": ["n1", "n2"]}),
                       ("/admission/validate", review(p)), ("/admission/mutate", review(p))):
        r = http.post(path, json=body)
        assert r.status_code in (200, 400), (path, r.text)


def test_health_readiness_and_openapi(state: ClusterState) -> None:
    fresh = ClusterState()
    c = TestClient(build_app(Service(fresh, None)))
    assert c.get("/healthz").text == "ok"
    r = c.get("/readyz")
    assert r.status_code == 503 and "waiting for the first list of nodes and pods" in r.text
    fresh.replace_nodes([])
    fresh.replace_pods([])
    assert c.get("/readyz").status_code == 200
    doc = c.get("/openapi.json").json()
    assert set(PATHS) <= set(doc["paths"])
    schema = doc["paths"]["/scheduler/filter"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/ExtenderArgs") and "ExtenderArgs" in doc["components"]["schemas"]
    no_api = c.post("/scheduler/bind", json={"PodName": "x", "PodNamespace": "d", "Node": "n"}).json()
    assert "without an apiserver" in no_api["Error"]


# --- bodies of the documented shape (the OpenAPI schemas), with arbitrary values: always 200, and sound ------
_names = st.text(alphabet="abcdefgh-", min_size=1, max_size=6)
_quantity = st.integers(0, 120).map(str) | st.sampled_from(["1.5", "-1", "abc", "1k", "100m", "0"])
_resources = st.dictionaries(st.sampled_from(["aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage",
                                              "aliyun.com/gpu-count", "cpu", "nvidia.com/gpu"]), _quantity, max_size=4)
_env = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD", "A",
                                                                "CUDA_DEVICE_SM_LIMIT", "GPUSHARE_X"])},
                                      optional={"value": st.text(max_size=3)}), max_size=3)
_container = st.fixed_dictionaries(
    {"name": _names}, optional={"resources": st.fixed_dictionaries({}, optional={"limits": _resources,
                                                                                 "requests": _resources}),
                                "env": _env})
_label_values = st.sampled_from(["0", "1", "2", "3", "-1", "x", "keep", ""])
_pods = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": _names, "namespace": _names, "uid": _names}, optional={
        "labels": st.dictionaries(st.sampled_from(["aliyun.com/gpu-count", "gpushare.io/visible-devices", "app"]),
                                  _label_values, max_size=2),
        "annotations": st.dictionaries(st.sampled_from(["gpushare.io/gpu-count", "gpushare.io/scheduled", "x"]),
                                       _label_values, max_size=2)}),
    "spec": st.fixed_dictionaries({"containers": st.lists(_container, min_size=1, max_size=3)},
                                  optional={"initContainers": st.lists(_container, max_size=2)}),
})
_node_names = st.lists(st.sampled_from(["n1", "n2", "ghost"]), unique=True, max_size=3)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=_pods, names=_node_names, full=st.booleans())
def test_well_shaped_extender_calls_always_get_a_sound_answer(http: TestClient, p: dict, names: list[str],
                                                               full: bool) -> None:
    args = {"Pod": p, "Nodes": {"items": [node(n) for n in names]}} if full else {"Pod": p, "NodeNames": names}
    r = http.post("/scheduler/filter", json=args)
    assert r.status_code == 200, r.text
    body = r.json()
    passed = [n["metadata"]["name"] for n in body["Nodes"]["items"]] if full else body["NodeNames"]
    verdicts = [passed, list(body["FailedNodes"]), list(body["FailedAndUnresolvableNodes"])]
    assert sorted(sum(verdicts, [])) == sorted(names)  # every node answered exactly once
    assert all(body["FailedNodes"].values()) and all(body["FailedAndUnresolvableNodes"].values())  # with a reason
    r = http.post("/scheduler/prioritize", json=args)
    assert r.status_code == 200 and [h["Host"] for h in r.json()] == names
    assert all(0 <= h["Score"] <= 10 for h in r.json())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=_pods)
def test_well_shaped_reviews_always_get_a_sound_answer(http: TestClient, p: dict) -> None:
    v = http.post("/admission/validate", json=review(p))
    assert v.status_code == 200, v.text
    resp = v.json()["response"]
    assert resp["uid"] == "req-1"
    assert resp["allowed"] or resp["status"]["message"]  # a denial always says why
    m = http.post("/admission/mutate", json=review(p))
    assert m.status_code == 200, m.text
    resp = m.json()["response"]
    assert resp["allowed"] is True
    if "patch" in resp:
        patched = jsonpatch.JsonPatch(json.loads(base64.b64decode(resp["patch"]))).apply(p)
        again = http.post("/admission/mutate", json=review(patched)).json()["response"]
        assert "patch" not in again  # idempotent


def test_preempt_answers_meta_victims(http: TestClient, state: ClusterState) -> None:
    victim = state.pods_on("n2")[0]
    args = {"Pod": pod(mem=20), "NodeNameToMetaVictims": {
        "n2": {"Pods": [{"UID": victim.uid}], "NumPDBViolations": 1},
        "n1": {"Pods": [], "NumPDBViolations": 0}}}
    r = http.post("/scheduler/preempt", json=args)
    assert r.status_code == 200
    assert r.json() == {"NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": victim.uid}], "NumPDBViolations": 1}}}
    bad = http.post("/scheduler/preempt", json={"Pod": pod(), "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}})
    assert bad.status_code == 400 and "UID" in bad.json()["error"]


def test_a_pod_naming_two_containers_alike_is_unresolvable_not_an_internal_error(http: TestClient) -> None:
    """The apiserver refuses such a pod; a filter call carrying one gets every node's reason, not a 500."""
    limits = {"resources": {"limits": {"aliyun.com/gpu-mem": "1"}}}
    twice = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
             "spec": {"initContainers": [{"name": "a", **limits}], "containers": [{"name": "a", **limits}]}}
    r = http.post("/scheduler/filter", json={"Pod": twice, "NodeNames": ["n1", "n2"]})
    assert r.status_code == 200, r.text
    reasons = r.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == {"n1", "n2"} and "container name 'a' is used twice" in reasons["n1"]
    denied = http.post("/admission/validate", json=review(twice)).json()["response"]
    assert denied["allowed"] is False and "used twice" in denied["status"]["message"], denied
