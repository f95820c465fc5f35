"""The node daemon's /metrics: scraped over HTTP from the real daemon (kubelet emulator, fake driver, fake
apiserver) after real admissions, parsed with prometheus_client's parser; the figures must be what was admitted."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.kubelet import AdmissionError
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.support.daemon_harness import CORE, COUNT, MEM, Running, _until, running

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(r: Running) -> Samples:
    with urllib.request.urlopen(r.metrics_url + "/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def per_gpu(samples: Samples, name: str) -> dict[str, float]:
    """{GPU UUID: value}"""
    return {labels["uuid"]: value for labels, value in samples[name]}


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(v for labels, v in samples.get(name, []) if all(labels.get(k) == x for k, x in match.items()))


def admission_calls(calls: list[str]) -> dict[tuple[str, str], int]:
    """(call, resource) -> how many, from the kubelet's own record of the RPCs it made."""
    out: dict[tuple[str, str], int] = {}
    for c in calls:
        name, _, resource = c.partition(" ")
        if name in ("GetPreferredAllocation", "Allocate"):
            out[(name, resource)] = out.get((name, resource), 0) + 1
    return out


@pytest.fixture
def r(api: FakeApiserver) -> Iterator[Running]:
    with running(apiserver=api, health_port=0) as run:
        assert run.registered_all()
        yield run


def test_figures_after_admissions_equal_what_was_admitted(r: Running) -> None:
    pods = [r.pod("a", mem=4, core=30), r.pod("b", mem=2, core=20), r.pod("c", mem=3), r.pod("w", count=1)]
    results = []
    for pod in pods:
        assert r.wait_cached(pod)
        results.append(r.admit(pod))
    bad = r.pod("bad", count=1, mem=2)  # gpu-count together with gpu-mem: refused by the daemon
    assert r.wait_cached(bad)
    with pytest.raises(AdmissionError) as refused:
        r.admit(bad)

    want_mem: dict[str, int] = {}
    want_core: dict[str, int] = {}
    want_containers: dict[str, int] = {}
    calls: list[str] = list(refused.value.calls)
    whole = set()
    for res in results:
        ct = res.containers[0]  # type: ignore[attr-defined]
        calls += ct.calls
        uuid = ct.envs["NVIDIA_VISIBLE_DEVICES"]
        want_containers[uuid] = want_containers.get(uuid, 0) + 1
        if COUNT in ct.device_ids:
            whole.add(uuid)
            continue
        want_mem[uuid] = want_mem.get(uuid, 0) + len(ct.device_ids.get(MEM, []))
        want_core[uuid] = want_core.get(uuid, 0) + len(ct.device_ids.get(CORE, []))

    m = scrape(r)
    node = r.nd.node  # type: ignore[union-attr]
    assert len(whole) == 1
    for gpu in node.gpus:
        labels = {labels["uuid"]: labels for labels, _ in m["gpushare_gpu_memory_allocated_units"]}[gpu.uuid]
        assert labels == {"node": "gpu-node", "gpu": str(gpu.index), "uuid": gpu.uuid}
        held_whole = gpu.uuid in whole
        assert per_gpu(m, "gpushare_gpu_memory_capacity_units")[gpu.uuid] == 15
        assert per_gpu(m, "gpushare_gpu_memory_capacity_bytes")[gpu.uuid] == 15 << 30
        assert per_gpu(m, "gpushare_gpu_memory_allocated_units")[gpu.uuid] == (
            15 if held_whole else want_mem.get(gpu.uuid, 0))
        assert per_gpu(m, "gpushare_gpu_memory_allocated_bytes")[gpu.uuid] == (
            15 if held_whole else want_mem.get(gpu.uuid, 0)) << 30
        assert per_gpu(m, "gpushare_gpu_core_allocated_percent")[gpu.uuid] == (
            100 if held_whole else want_core.get(gpu.uuid, 0))
        assert per_gpu(m, "gpushare_gpu_core_capacity_percent")[gpu.uuid] == 100
        assert per_gpu(m, "gpushare_gpu_containers")[gpu.uuid] == want_containers.get(gpu.uuid, 0)
        assert per_gpu(m, "gpushare_gpu_whole_held")[gpu.uuid] == (1 if held_whole else 0)
        assert per_gpu(m, "gpushare_gpu_healthy")[gpu.uuid] == 1
    assert sum(want_mem.values()) == 9 and sum(want_core.values()) == 50  # what the pods asked for

    # one refusal, with its class and reason code, on the call the kubelet saw fail
    refusals = [(labels, v) for labels, v in m["gpushare_admission_refusals_total"] if v]
    assert len(refusals) == 1, refusals
    labels, value = refusals[0]
    assert value == 1
    assert labels["error"] == "invalid_request" and labels["reason"] == "count_with_share"
    assert labels["call"] in ("GetPreferredAllocation", "Allocate") and labels["resource"] in (MEM, COUNT)

    # one histogram observation per admission RPC the kubelet made, the refused one included (its calls list it)
    made = admission_calls(calls)
    assert refused.value.calls[-1] == f"{labels['call']} {labels['resource']}"
    seen = {(lab["call"], lab["resource"]): int(v) for lab, v in m["gpushare_admission_duration_seconds_count"]}
    assert {k: v for k, v in seen.items() if v} == made
    assert total(m, "gpushare_admission_duration_seconds_sum") > 0
    for lab, v in m["gpushare_admission_duration_seconds_bucket"]:
        if lab["le"] == "+Inf":
            assert v == seen[(lab["call"], lab["resource"])]

    # every container was named from the pod cache: no node-local pairing
    lookups = {lab["outcome"]: v for lab, v in m["gpushare_pod_lookups_total"]}
    assert lookups["cache"] >= 4 and lookups["not_found"] == lookups["no_answer"] == 0
    assert {lab["resource"]: v for lab, v in m["gpushare_resource_registered"]} == {MEM: 1, CORE: 1, COUNT: 1}
    assert [lab for lab, _ in m["gpushare_node_info"]] == [
        {"node": "gpu-node", "mode": "core_mem", "placement": "binpack", "mem_unit": "GiB"}]


def test_units_come_back_in_the_figures_when_a_pod_ends(r: Running, api: FakeApiserver) -> None:
    pod = r.pod("a", mem=5, core=40)
    assert r.wait_cached(pod)
    uuid = r.admit(pod).containers[0].envs["NVIDIA_VISIBLE_DEVICES"]  # type: ignore[attr-defined]
    assert per_gpu(scrape(r), "gpushare_gpu_memory_allocated_units")[uuid] == 5
    api.set_pod_phase("default", "a", "Succeeded")
    assert _until(lambda: per_gpu(scrape(r), "gpushare_gpu_memory_allocated_units")[uuid] == 0, 5)
    m = scrape(r)
    assert per_gpu(m, "gpushare_gpu_core_allocated_percent")[uuid] == 0
    assert per_gpu(m, "gpushare_gpu_containers")[uuid] == 0


def test_unhealthy_gpu_and_its_reason(r: Running) -> None:
    r.driver.raise_xid(2, 79)  # fallen off the bus: stays unhealthy
    uuid = r.nd.node.gpus[2].uuid  # type: ignore[union-attr]
    assert _until(lambda: per_gpu(scrape(r), "gpushare_gpu_healthy")[uuid] == 0, 5)
    m = scrape(r)
    assert sum(per_gpu(m, "gpushare_gpu_healthy").values()) == 3
    [(labels, value)] = m["gpushare_gpu_unhealthy_info"]
    assert labels["uuid"] == uuid and labels["gpu"] == "2" and "79" in labels["reason"] and value == 1


def test_apiserver_write_failures_are_counted(r: Running, api: FakeApiserver) -> None:
    before = total(scrape(r), "gpushare_apiserver_errors_total", operation="write")
    api.down()
    r.nd.link.writer.node_event("gpu-node", "Warning", "Test", "while the apiserver is down")  # type: ignore[union-attr]
    assert _until(lambda: total(scrape(r), "gpushare_apiserver_errors_total", operation="write") > before, 5)
    api.up()
    operations = {lab["operation"] for lab, _ in scrape(r)["gpushare_apiserver_errors_total"]}
    assert operations == {"pod_watch", "pod_fetch", "write"}  # the harness's link has no node watch


def test_health_paths_still_answer_and_unknown_paths_name_metrics(r: Running) -> None:
    with urllib.request.urlopen(r.http_url + "/readyz", timeout=5) as resp:
        assert resp.status == 200
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(r.http_url + "/nope", timeout=5)
    assert err.value.code == 404 and "/metrics" in err.value.read().decode()


def test_two_daemons_in_one_process_keep_their_own_figures() -> None:
    with running(health_port=0) as one, running(health_port=0, mode="cgpu") as two:
        assert one.registered_all() and two.registered_all(resources=(MEM, COUNT))
        one.kubelet.admit(pod_spec_mem("x", 6))
        a, b = scrape(one), scrape(two)
        assert sum(per_gpu(a, "gpushare_gpu_memory_allocated_units").values()) == 6
        assert sum(per_gpu(b, "gpushare_gpu_memory_allocated_units").values()) == 0
        assert {lab["resource"] for lab, _ in b["gpushare_resource_registered"]} == {MEM, COUNT}
        # without pod identity the container was placed by node-local pairing: no lookup was made
        assert total(a, "gpushare_pod_lookups_total") == 0


def pod_spec_mem(name: str, mem: int) -> PodSpec:
    """A pod the kubelet admits without an apiserver (no pod identity)."""
    return PodSpec(name=name, namespace="default", uid=f"uid-{name}", containers=[
        ContainerSpec(name="main", limits={MEM: mem})])
