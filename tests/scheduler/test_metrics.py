"""The scheduler service's /metrics: extender and webhook calls through the real Starlette app, then a scrape
parsed with prometheus_client's parser; counts, outcomes and the room per GPU must be what the calls did."""

from __future__ import annotations

import warnings

import pytest
from prometheus_client.parser import text_string_to_metric_families

with warnings.catch_warnings():  # Starlette's note about the HTTP library under its test client
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster, held
from tests.scheduler.test_http import review
from tests.support.scheduler_objects import container, node, pod

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(http: TestClient) -> Samples:
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def by(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {labels[label]: v for labels, v in samples.get(name, [])}


def gpus_of(samples: Samples, name: str, node_name: str) -> dict[str, float]:
    return {labels["gpu"]: v for labels, v in samples.get(name, []) if labels["node"] == node_name}


@pytest.fixture()
def state() -> ClusterState:
    s = ClusterState()
    s.replace_nodes([node("n1", gpus=4, units=15), node("n2", gpus=2, units=24)])
    s.replace_pods([held(1, 20, core=40, node_name="n2"), pod("p", mem=10, core=30, uid="uid-p")])
    return s


@pytest.fixture()
def http(state: ClusterState) -> TestClient:
    return TestClient(build_app(Service(state, FakeCluster(state), max_body=64 * 1024)))


def test_extender_calls_bind_outcomes_and_room_per_gpu(http: TestClient) -> None:
    before = scrape(http)
    assert [v for _, v in before["gpushare_extender_assumptions"]] == [0]
    assert gpus_of(before, "gpushare_extender_gpu_memory_allocated_units", "n2") == {"0": 0, "1": 20}
    assert gpus_of(before, "gpushare_extender_gpu_core_allocated_percent", "n2") == {"0": 0, "1": 40}

    r = http.post("/scheduler/filter", json={"Pod": pod("p", mem=10, core=30, uid="uid-p"), "NodeNames": ["n1", "n2"]})
    assert r.json()["NodeNames"] == ["n1", "n2"]
    http.post("/scheduler/prioritize", json={"Pod": pod(mem=20), "NodeNames": ["n1", "n2"]})
    ok = http.post("/scheduler/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p",
                                            "Node": "n1"})
    assert ok.json().get("Error", "") == ""
    gone = http.post("/scheduler/bind", json={"PodName": "nope", "PodNamespace": "default", "PodUID": "x",
                                              "Node": "n1"})
    assert gone.json()["Error"]

    m = scrape(http)
    assert by(m, "gpushare_extender_duration_seconds_count", "verb") == {
        "filter": 1, "prioritize": 1, "preempt": 0, "bind": 2}
    assert by(m, "gpushare_extender_binds_total", "outcome") == {
        "bound": 1, "failed": 1, "no_apiserver": 0, "error": 0}
    assert by(m, "gpushare_extender_filter_nodes_total", "result") == {"passed": 2, "failed": 0, "unresolvable": 0}
    # the bound pod's choice is assumed until the watch shows it bound, and counted on its GPU meanwhile
    assert [v for _, v in m["gpushare_extender_assumptions"]] == [1]
    n1_mem = gpus_of(m, "gpushare_extender_gpu_memory_allocated_units", "n1")
    n1_core = gpus_of(m, "gpushare_extender_gpu_core_allocated_percent", "n1")
    [gpu] = [g for g, v in n1_mem.items() if v]
    assert n1_mem[gpu] == 10 and n1_core == {g: (30 if g == gpu else 0) for g in n1_mem}
    assert gpus_of(m, "gpushare_extender_gpu_containers", "n1") == {g: (1 if g == gpu else 0) for g in n1_mem}
    assert gpus_of(m, "gpushare_extender_gpu_memory_capacity_units", "n1") == {"0": 15, "1": 15, "2": 15, "3": 15}
    assert gpus_of(m, "gpushare_extender_gpu_core_capacity_percent", "n2") == {"0": 100, "1": 100}
    assert by(m, "gpushare_extender_node_usable", "node") == {"n1": 1, "n2": 1}
    for labels, v in m["gpushare_extender_duration_seconds_bucket"]:
        if labels["le"] == "+Inf":
            assert v == by(m, "gpushare_extender_duration_seconds_count", "verb")[labels["verb"]]


def test_webhook_latency_reviews_and_denials_by_rule(http: TestClient) -> None:
    bad = [pod(count=1, mem=2), pod(core=30), pod(containers=[container(mem=2, env={"LD_PRELOAD": "x"}),
                                                                container("b", core=30)])]
    for obj in bad:
        assert http.post("/admission/validate", json=review(obj)).json()["response"]["allowed"] is False
    assert http.post("/admission/validate", json=review(pod(mem=4))).json()["response"]["allowed"] is True
    http.post("/admission/mutate", json=review(pod(containers=[container("cpu")])))
    http.post("/admission/mutate", json=review(pod(mem=2)))

    m = scrape(http)
    assert by(m, "gpushare_webhook_duration_seconds_count", "webhook") == {"validate": 4, "mutate": 2}
    assert by(m, "gpushare_webhook_denials_total", "rule") == {
        "count_with_share": 1, "core_without_mem": 2, "reserved_env": 1}
    reviews = {(lab["webhook"], lab["result"]): v for lab, v in m["gpushare_webhook_reviews_total"]}
    assert reviews == {("validate", "denied"): 3, ("validate", "allowed"): 1, ("mutate", "patched"): 1,
                       ("mutate", "allowed"): 1}


def test_without_an_apiserver_binds_are_counted_as_such(state: ClusterState) -> None:
    http = TestClient(build_app(Service(state, None)))
    http.post("/scheduler/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"})
    assert by(scrape(http), "gpushare_extender_binds_total", "outcome")["no_apiserver"] == 1


def test_two_apps_keep_their_own_figures(state: ClusterState) -> None:
    one = TestClient(build_app(Service(state, FakeCluster(state))))
    two = TestClient(build_app(Service(ClusterState(), None)))
    one.post("/scheduler/filter", json={"Pod": pod(mem=2), "NodeNames": ["n1"]})
    assert by(scrape(one), "gpushare_extender_duration_seconds_count", "verb")["filter"] == 1
    m2 = scrape(two)
    assert by(m2, "gpushare_extender_duration_seconds_count", "verb")["filter"] == 0
    assert "gpushare_extender_gpu_memory_allocated_units" not in m2  # no node known
