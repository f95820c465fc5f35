"""`devplugin inspect`'s DRA part on recorded objects: tests/dra/recorded/two-nodes.json holds the ResourceSlices
`devplugin dra` publishes (node-a: two 15 GiB GPUs; node-b: one, failed with XID 48, so tainted) and the
ResourceClaims as the real kube-scheduler 1.36 allocated them (train 4Gi / 30; infer asked 1000Mi / 33 and was
rounded up to 1Gi / 35; shared 2Gi / 10 reserved for two pods; exclusive a whole GPU; too-big 20Gi fits no GPU).
Per GPU: the claims on it with their pods, consumed capacity and shareID, and total / allocated / free. The
command shows the DRA part after the device-plugin view, leaves that view as it was on a cluster without DRA,
and says on stderr when the account may not read the DRA objects."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException

from devplugin.inspect import dra_read
from devplugin.inspect.cli import main
from devplugin.inspect.dra_layout import render_dra_text
from devplugin.inspect.dra_report import ClaimOnGpu, DraReport, build_dra_report
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.support.scheduler_objects import node

RECORDED = json.loads((Path(__file__).parents[1] / "dra" / "recorded" / "two-nodes.json").read_text())
GiB = 1 << 30


def report(**kw: str) -> DraReport:
    return build_dra_report(RECORDED["slices"], RECORDED["claims"], **kw)


def test_each_gpu_lists_its_claims_and_its_total_allocated_and_free() -> None:
    r = report()
    assert [n.name for n in r.nodes] == ["node-a", "node-b"]
    gpu0, gpu1 = r.nodes[0].gpus
    assert (gpu0.index, gpu0.uuid, gpu0.model) == (0, "GPU-node-a-0000-0000-0000-000000000000",
                                                   "NVIDIA A100-SXM4-80GB")
    assert gpu0.devices == ["gpu-0", "gpu-0-whole"] and gpu0.taints == []
    assert [(c.name, c.pods, c.memory, c.cores, c.whole) for c in gpu0.claims] == [
        ("infer", ["infer-0"], 1 * GiB, 35, False),  # what the scheduler consumed, not the 1000Mi / 33 asked
        ("shared", ["shared-a", "shared-b"], 2 * GiB, 10, False),  # one claim, two pods: counted once
        ("train", ["train-0"], 4 * GiB, 30, False)]
    assert [c.shareID for c in gpu0.claims] == ["1022b47e-e72d-4826-85c8-827cb3d722e0",
                                                "7a831877-465f-4d77-bd1d-71a677ab61de",
                                                "b2901513-53bc-41b0-8228-ee919a890b75"]
    assert (gpu0.memTotal, gpu0.memAllocated, gpu0.memFree) == (15 * GiB, 7 * GiB, 8 * GiB)
    assert (gpu0.coreTotal, gpu0.coreAllocated, gpu0.coreFree, gpu0.whole) == (100, 75, 25, False)
    assert gpu1.claims == [ClaimOnGpu("default", "exclusive", "gpu", ["exclusive-0"], 15 * GiB, 100, "", True)]
    assert (gpu1.memAllocated, gpu1.memFree, gpu1.coreAllocated, gpu1.coreFree, gpu1.whole) == (15 * GiB, 0, 100, 0,
                                                                                                True)
    (sick,) = r.nodes[1].gpus
    assert sick.taints == ["gpu.gpushare.io/unhealthy=xid-48:NoSchedule"] and sick.claims == []
    assert (r.nodes[0].memTotal, r.nodes[0].memAllocated) == (30 * GiB, 22 * GiB)
    assert (r.memTotal, r.memAllocated, r.largestGpuMemory) == (45 * GiB, 22 * GiB, 15 * GiB)
    assert [(p.name, p.requests) for p in r.pending] == [
        ("too-big", ["gpu: cores 50, memory 20Gi (gpu.gpushare.io)"])]
    assert r.unplaced == []


def test_text_per_node_and_gpu_with_the_claims_on_each() -> None:
    text = render_dra_text(report(limit="80Gi"), details=True)
    assert text == """\
DRA (gpu.gpushare.io)
node-a
  GPU  MEMORY(GiB)  FREE  CORE(%)  FREE  CLAIMS
  0    7/15         8     75/100   25    3
       default/infer (gpu)  infer-0  1 GiB  35 %  share 1022b47e
       default/shared (gpu)  shared-a,shared-b  2 GiB  10 %  share 7a831877
       default/train (gpu)  train-0  4 GiB  30 %  share b2901513
  1    15/15        0     whole    0     1
       default/exclusive (gpu)  exclusive-0  whole GPU
  all  22/30 (73%)  8     175/200  25    4

node-b
  GPU  MEMORY(GiB)  FREE  CORE(%)  FREE  CLAIMS
  0    0/15         15    0/100    100   0       unhealthy xid-48
  all  0/15 (0%)    15    0/100    100   0

PENDING CLAIM    REQUESTS
default/too-big  gpu: cores 50, memory 20Gi (gpu.gpushare.io)

Largest GPU: 15 GiB; claims' memory limit 80Gi (kube-system/gpushare-dra-limits)
Allocated/Total GPU Memory (DRA): 22/45 GiB (49%)
"""
    assert all(len(line) <= 80 for line in text.splitlines())


def test_a_limit_below_the_largest_gpu_is_pointed_out() -> None:
    text = render_dra_text(report(limit="12Gi"))
    assert ("Largest GPU: 15 GiB; claims' memory limit 12Gi (kube-system/gpushare-dra-limits); claims above 12Gi "
            "are refused though a GPU offers 15 GiB: raise it") in " ".join(text.split())
    unset = " ".join(render_dra_text(report()).split())
    assert ("Largest GPU: 15 GiB; claims' memory limit not set (kube-system/gpushare-dra-limits, largestGpuMemory): "
            "not checked") in unset


def test_one_node_shows_its_gpus_only() -> None:
    r = report(node="node-b")
    assert [n.name for n in r.nodes] == ["node-b"] and r.pending == [] and r.node == "node-b"
    assert "PENDING" not in render_dra_text(r) and "Largest" not in render_dra_text(r)


def test_json_carries_every_figure() -> None:
    out = json.loads(json.dumps(report().to_json()))
    claim = out["nodes"][0]["gpus"][0]["claims"][1]
    assert claim == {"namespace": "default", "name": "shared", "request": "gpu", "pods": ["shared-a", "shared-b"],
                     "memory": 2 * GiB, "cores": 10, "shareID": "7a831877-465f-4d77-bd1d-71a677ab61de",
                     "whole": False}
    assert {k: out["nodes"][0]["gpus"][0][k] for k in ("memTotal", "memAllocated", "memFree", "coreTotal",
                                                       "coreAllocated", "coreFree")} == {
        "memTotal": 15 * GiB, "memAllocated": 7 * GiB, "memFree": 8 * GiB, "coreTotal": 100, "coreAllocated": 75,
        "coreFree": 25}


def test_an_older_pool_generation_is_ignored_and_a_device_it_alone_named_is_reported() -> None:
    slices = copy.deepcopy(RECORDED["slices"])
    stale = copy.deepcopy(next(s for s in slices if s["metadata"]["name"] == "node-a-gpushare-devices"))
    for s in slices:
        if s["spec"]["pool"]["name"] == "node-a":
            s["spec"]["pool"]["generation"] += 1
            if "devices" in s["spec"]:  # the new generation drops GPU 1
                s["spec"]["devices"] = [d for d in s["spec"]["devices"] if not d["name"].startswith("gpu-1")]
    stale["metadata"]["name"] = "node-a-old"
    r = build_dra_report([*slices, stale], RECORDED["claims"])
    assert [g.index for g in r.nodes[0].gpus] == [0]
    assert r.unplaced == ["default/exclusive: node-a/gpu-1-whole"]
    assert "Allocated on devices no current ResourceSlice publishes:" in render_dra_text(r)


def test_another_drivers_slices_and_claims_are_left_out() -> None:
    slices = copy.deepcopy(RECORDED["slices"])
    claims = copy.deepcopy(RECORDED["claims"])
    for s in slices:
        s["spec"]["driver"] = "gpu.nvidia.com"
    for c in claims:
        for res in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            res["driver"] = "gpu.nvidia.com"
        for req in c["spec"]["devices"]["requests"]:
            req["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    r = build_dra_report(slices, claims)
    assert (r.nodes, r.pending, r.unplaced) == ([], [], [])


def _mangle(obj: object, path: list[int], value: object) -> object:
    """obj with the leaf reached by walking `path` (indices into sorted keys / items) replaced by `value`."""
    if not path or not isinstance(obj, (dict, list)) or not obj:
        return value
    keys = sorted(obj) if isinstance(obj, dict) else list(range(len(obj)))
    key = keys[path[0] % len(keys)]
    out = copy.copy(obj)
    out[key] = _mangle(obj[key], path[1:], value)  # type: ignore[index]
    return out


@settings(max_examples=150, deadline=None)
@given(which=st.integers(0, 100), path=st.lists(st.integers(0, 50), max_size=9),
       value=st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=8), st.just({}), st.just([]),
                       st.just("1e100"), st.just("-4Gi")))
def test_hostile_or_broken_objects_never_break_the_report(which: int, path: list[int], value: object) -> None:
    """Any field of any slice or claim replaced by junk: the report still builds and renders within 80 columns,
    and on every GPU allocated + free = total."""
    objects = RECORDED["slices"] + RECORDED["claims"]
    i = which % len(objects)
    mangled = [(_mangle(o, path, value) if j == i else o) for j, o in enumerate(objects)]
    slices = [o for o in mangled[:len(RECORDED["slices"])] if isinstance(o, dict)]
    claims = [o for o in mangled[len(RECORDED["slices"]):] if isinstance(o, dict)]
    try:
        r = build_dra_report(slices, claims)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise AssertionError(f"object {i} at {path} = {value!r}: {exc!r}") from exc
    assert all(len(line) <= 80 for line in render_dra_text(r, details=True).splitlines())
    for n in r.nodes:
        for g in n.gpus:
            assert g.memAllocated + g.memFree == g.memTotal and g.coreAllocated + g.coreFree == g.coreTotal


# --- the command: the DRA part beside the device-plugin view (fake apiserver for nodes and pods) ---------------

@pytest.fixture()
def dp_cluster() -> Iterator[FakeApiserver]:
    """One device-plugin node with a pod (the fake apiserver serves no resource.k8s.io: a cluster before DRA)."""
    with FakeApiserver() as api:
        n = node("gpu-a", gpus=1, units=16, mode="core_mem")
        api.add_node("gpu-a", labels=n["metadata"]["labels"], annotations=n["metadata"]["annotations"])
        yield api


def _inspect(api: FakeApiserver, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert main([*args, "--no-use", "--kubeconfig", api.kubeconfig_path]) == 0
    out, err = capsys.readouterr()
    return out, err


def test_without_dra_the_view_is_the_device_plugin_one_alone(dp_cluster: FakeApiserver,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out, err = _inspect(dp_cluster, capsys)
    assert "DRA" not in out and err == "" and out.startswith("gpu-a  ")
    assert "dra" not in json.loads(_inspect(dp_cluster, capsys, "-o", "json")[0])


def test_a_cluster_with_both_modes_shows_both(dp_cluster: FakeApiserver, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    alone, _ = _inspect(dp_cluster, capsys)
    monkeypatch.setattr(dra_read, "read_dra", lambda api, node="": dra_read.DraObjects(
        RECORDED["slices"], RECORDED["claims"], "80Gi", True))
    out, err = _inspect(dp_cluster, capsys)
    assert err == "" and out == alone + "\n" + render_dra_text(report(limit="80Gi"))
    doc = json.loads(_inspect(dp_cluster, capsys, "-o", "json")[0])
    assert doc["nodes"][0]["name"] == "gpu-a" and doc["dra"] == report(limit="80Gi").to_json()


def test_dra_objects_the_account_may_not_read_are_said_on_stderr(dp_cluster: FakeApiserver,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    alone, _ = _inspect(dp_cluster, capsys)

    def forbidden(api: object, node: str = "") -> dra_read.DraObjects:
        raise ApiException(status=403, reason="Forbidden")
    monkeypatch.setattr(dra_read, "read_dra", forbidden)
    out, err = _inspect(dp_cluster, capsys)
    assert (out, err) == (alone, "inspect: DRA claims not shown: the apiserver answered 403: Forbidden\n")
