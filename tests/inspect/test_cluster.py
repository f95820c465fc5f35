"""`devplugin inspect` / kubectl-inspect-gpushare on a cluster of several nodes, through the fake apiserver."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from devplugin.contract import (
    ANN_ALIYUN_MEM_IDX,
    ANN_ALLOCATED,
    ANN_NODE_GPUS,
    ANN_SCHEDULED,
    GpuShare,
    NodeGpu,
    NodeInventory,
    PodAssignment,
)
from devplugin.inspect.cli import main
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.support.scheduler_objects import CORE, COUNT, MEM, node


def assignment(node_name: str, **containers: tuple[GpuShare, ...]) -> str:
    return PodAssignment(node_name, 1, containers).render()


@pytest.fixture()
def cluster() -> Iterator[FakeApiserver]:
    with FakeApiserver() as api:
        for ip, (name, kw) in enumerate((("gpu-a", {"gpus": 2, "units": 16, "mode": "core_mem"}),
                         ("gpu-b", {"gpus": 4, "units": 15, "mode": "cgpu", "unhealthy": (3,)})), 5):
            n = node(name, **kw)
            api.add_node(name, labels=n["metadata"]["labels"], annotations=n["metadata"]["annotations"])
            api.patch_node(name, {"status": {"addresses": [{"type": "InternalIP", "address": f"10.0.0.{ip}"}]}})
        api.add_node("cpu-only")
        api.add_node("gpu-c", annotations={"gpushare.io/gpus": "{broken"})
        api.add_pod(name="train", namespace="ml", node_name="gpu-a", phase="Running", limits={MEM: 6, CORE: 30},
                    annotations={ANN_ALLOCATED: assignment("gpu-a", main=(GpuShare(0, "", 6, 30),))})
        api.add_pod(name="serve", node_name="gpu-a", limits={MEM: 4},
                    annotations={ANN_SCHEDULED: assignment("gpu-a", main=(GpuShare(0, "", 4, 0),))})
        api.add_pod(name="whole", node_name="gpu-a", phase="Running", limits={COUNT: 1},
                    annotations={ANN_ALLOCATED: assignment("gpu-a", main=(GpuShare(1, "", 16, 0, whole=True),))})
        api.add_pod(name="legacy", node_name="gpu-b", phase="Running", limits={MEM: 5},
                    annotations={ANN_ALIYUN_MEM_IDX: "2", "ALIYUN_COM_GPU_MEM_ASSIGNED": "true"})
        api.add_pod(name="done", node_name="gpu-b", phase="Succeeded", limits={MEM: 15},
                    annotations={ANN_ALIYUN_MEM_IDX: "0"})
        api.add_pod(name="waiting", limits={MEM: 20})
        api.add_pod(name="cpu", node_name="cpu-only", phase="Running")
        yield api


def run(capsys: pytest.CaptureFixture[str], api: FakeApiserver, *args: str) -> str:
    assert main([*args, "--kubeconfig", api.kubeconfig_path]) == 0
    return capsys.readouterr().out


def test_text_summary_per_node_and_gpu(cluster: FakeApiserver, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, cluster, "--no-use")
    assert all(len(line) <= 80 for line in out.splitlines())
    assert out == (
        "gpu-a  10.0.0.5  core_mem  binpack\n"
        "  GPU  MEMORY(GiB)  CORE(%)  PODS\n"
        "  0    10/16        30/100   2\n"
        "  1    16/16        whole    1\n"
        "  all  26/32 (81%)  130/200  3\n"
        "\n"
        "gpu-b  10.0.0.6  cgpu  binpack\n"
        "  GPU  MEMORY(GiB)  CORE(%)  PODS\n"
        "  0    0/15         0/100    0\n"
        "  1    0/15         0/100    0\n"
        "  2    5/15         0/100    1\n"
        "  3    0/15         0/100    0     unhealthy\n"
        "  all  5/60 (8%)    0/400    1\n"
        "\n"
        "gpu-c\n"
        "  ! annotation gpushare.io/gpus is not JSON: Expecting property name enclosed in\n"
        "    double quotes: line 1 column 2 (char 1); the node daemon must republish it\n"
        "\n"
        "PENDING          NODE  MEMORY  CORE(%)  GPUS\n"
        "default/waiting  -     20      0        0\n"
        "\n"
        + "-" * 60 + "\n"
        "Allocated/Total GPU Memory In Cluster: 31/92 GiB (34%)\n")


def test_details_list_the_pods_on_each_gpu(cluster: FakeApiserver, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, cluster, "-d", "gpu-a")
    assert "       ml/train (main)  6 GiB  30 %  allocated\n" in out
    assert "       default/serve (main)  4 GiB  0 %  scheduled\n" in out
    assert "       default/whole (main)  whole GPU  allocated\n" in out
    assert "gpu-b" not in out and "PENDING" not in out
    assert out.index("ml/train") < out.index("  1    16/16")


def test_json_for_scripts(cluster: FakeApiserver, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(run(capsys, cluster, "-o", "json"))
    assert [n["name"] for n in doc["nodes"]] == ["gpu-a", "gpu-b", "gpu-c"]
    assert "not JSON" in doc["nodes"][2]["problem"] and doc["nodes"][2]["gpus"] == []
    gpu0 = doc["nodes"][0]["gpus"][0]
    assert (gpu0["memAllocated"], gpu0["memTotal"], gpu0["coreAllocated"]) == (10, 16, 30)
    assert {(p["namespace"], p["name"], p["state"]) for p in gpu0["pods"]} == {
        ("ml", "train", "allocated"), ("default", "serve", "scheduled")}
    assert doc["nodes"][1]["gpus"][3]["healthy"] is False
    assert doc["nodes"][1]["gpus"][2]["pods"][0]["state"] == "allocated"  # Alibaba's ASSIGNED=true
    assert doc["pending"] == [{"namespace": "default", "name": "waiting", "node": "", "mem": 20, "core": 0,
                               "count": 0}]
    assert (doc["memAllocatedMiB"], doc["memTotalMiB"]) == (31 * 1024, 92 * 1024)


def test_errors_are_one_line(cluster: FakeApiserver, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nope", "--kubeconfig", cluster.kubeconfig_path]) == 1
    assert capsys.readouterr().err == "inspect: node 'nope' not found\n"
    cluster.down("refuse")
    assert main(["--kubeconfig", cluster.kubeconfig_path]) == 1
    assert capsys.readouterr().err.startswith("inspect: cannot reach the apiserver")


def test_no_kubeconfig_says_what_to_set(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith("inspect: cannot load a kubeconfig") and "set KUBECONFIG or --kubeconfig" in err
    assert main(["--kubeconfig", "/nonexistent/other"]) == 1
    assert capsys.readouterr().err.startswith("inspect: cannot load a kubeconfig: ")


def test_hostile_annotations_do_not_crash_inspect(cluster: FakeApiserver, capsys: pytest.CaptureFixture[str]) -> None:
    for i, ann in enumerate(({ANN_ALLOCATED: '{"time": 1e999}'}, {"scheduler.framework.gpushare.allocation":
                             '{"0": {"0": 1e999}}'}, {ANN_ALIYUN_MEM_IDX: "\u00b2"},
                             {ANN_SCHEDULED: '{"containers": {"main": [{"index": 0, "mem": -15}]}}'})):
        cluster.add_pod(name=f"hostile-{i}", node_name="gpu-a", phase="Running", limits={MEM: 1}, annotations=ann)
    cluster.add_pod(name="cpu-hostile", node_name="gpu-a", phase="Running",
                    annotations={ANN_ALLOCATED: '{"time": 1e999}'})
    cluster.add_pod(name="bad-quantity", node_name="gpu-a", phase="Running", limits={MEM: "\u00b9"})
    cluster.add_node("gpu-d", annotations={"gpushare.io/gpus": '{"mode": "core_mem", "gpus": [{"index": 1e999}]}'})
    doc = json.loads(run(capsys, cluster, "-o", "json"))
    gpu0 = doc["nodes"][0]["gpus"][0]
    assert (gpu0["memAllocated"], gpu0["memTotal"]) == (10, 16)  # junk takes no room
    assert "the number 1e999 is not a whole number" in doc["nodes"][3]["problem"]
    assert {p["name"] for p in doc["pending"]} >= {"hostile-0", "hostile-1", "hostile-2", "hostile-3"}


def test_use_unknown_says_why_and_shows_dashes(cluster: FakeApiserver, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, cluster, "gpu-a")
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "  ! use unknown: no running node daemon pod (app=gpushare-devplugin) on this\n" in out
    assert "  GPU  MEMORY(GiB)  USED  CORE(%)  USED  PODS\n" in out
    assert "  0    10/16        -     30/100   -     2\n" in out
    doc = json.loads(run(capsys, cluster, "-o", "json", "gpu-a"))
    assert "no running node daemon pod" in doc["nodes"][0]["useError"]
    assert doc["nodes"][0]["gpus"][0]["memUsedMiB"] is None


def test_each_gpu_shows_its_nvlink_island_when_the_node_publishes_one(capsys: pytest.CaptureFixture[str]) -> None:
    inventory = NodeInventory("core_mem", "binpack", 1024, tuple(
        NodeGpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80, 80 * 1024, healthy=i != 3,
                nvlink_island=i // 2 if i < 3 else None, numa_node=0) for i in range(4)))
    with FakeApiserver() as api:
        api.add_node("islands", annotations={ANN_NODE_GPUS: inventory.render()},
                     labels={"gpushare": "true", "ack.node.gpu.schedule": "core_mem"})
        out = run(capsys, api, "--no-use")
        assert [line.split()[0::4] for line in out.splitlines()[2:6]] == [["0", "nvlink"], ["1", "nvlink"],
                                                                          ["2", "nvlink"], ["3", "unhealthy"]]
        assert [line.split()[-2:] for line in out.splitlines()[2:5]] == [["nvlink", "0"], ["nvlink", "0"],
                                                                         ["nvlink", "1"]]
        gpus = json.loads(run(capsys, api, "--no-use", "-o", "json"))["nodes"][0]["gpus"]
        assert [(g["nvlink"], g["numa"]) for g in gpus] == [(0, 0), (0, 0), (1, 0), (None, 0)]
