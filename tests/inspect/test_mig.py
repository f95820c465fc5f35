"""`devplugin inspect` on a node with MIG devices: each MIG device a row of its own, under a row of its GPU, with
its profile, in the text and in the JSON report."""

from __future__ import annotations

import json

import pytest

from devplugin import contract as c
from devplugin.inspect.cli import main
from devplugin_sim.fake_apiserver import FakeApiserver
from tests.support.scheduler_objects import CORE, MEM


def inventory() -> str:
    return c.NodeInventory(mode="core_mem", placement="binpack", mem_unit_mib=1024, gpus=(
        c.NodeGpu(0, "GPU-a", "NVIDIA A100-SXM4-80GB", 80, 81920),
        c.NodeGpu(2, "GPU-c", "NVIDIA A100-SXM4-80GB", 80, 81920),
        c.NodeGpu(3, "MIG-x", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 39, 40192, parent_uuid="GPU-b", parent_index=1,
                  mig_profile="3g.40gb"),
        c.NodeGpu(4, "MIG-y", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9, 9728, healthy=False, parent_uuid="GPU-b",
                  parent_index=1, mig_profile="1g.10gb"),
    )).render()


def test_mig_devices_are_listed_under_their_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeApiserver() as api:
        api.add_node("mig-node", labels={"ack.node.gpu.schedule": "core_mem"},
                     annotations={c.ANN_NODE_GPUS: inventory()})
        api.add_pod(name="small", node_name="mig-node", phase="Running", limits={MEM: 4, CORE: 30},
                    annotations={c.ANN_ALLOCATED: c.PodAssignment("mig-node", 1, {
                        "main": (c.GpuShare(3, "MIG-x", 4, 30),)}).render()})
        assert main(["--no-use", "--kubeconfig", api.kubeconfig_path]) == 0
        out = capsys.readouterr().out
        assert main(["--no-use", "-o", "json", "--kubeconfig", api.kubeconfig_path]) == 0
        doc = json.loads(capsys.readouterr().out)
    rows = [line.split() for line in out.splitlines()[2:7]]
    assert rows == [["0", "0/80", "0/100", "0"],
                    ["1", "MIG"],
                    ["3", "3g.40gb", "4/39", "30/100", "1"],
                    ["4", "1g.10gb", "0/9", "0/100", "0", "unhealthy"],
                    ["2", "0/80", "0/100", "0"]]
    mig = {g["uuid"]: g for g in doc["nodes"][0]["gpus"]}["MIG-y"]
    assert (mig["parent"], mig["parentIndex"], mig["migProfile"]) == ("GPU-b", 1, "1g.10gb")
