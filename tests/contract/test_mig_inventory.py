"""The node inventory annotation with MIG devices: each MIG device an entry of its own, under its GPU (parent
UUID and index, profile); entries without MIG fields and older annotations parse as before."""

from __future__ import annotations

import json

from devplugin import contract as c


def test_mig_devices_round_trip_with_their_parent_and_profile() -> None:
    inv = c.NodeInventory(mode="core_mem", placement="binpack", mem_unit_mib=1024, gpus=(
        c.NodeGpu(0, "GPU-a", "NVIDIA A100-SXM4-80GB", 80, 81920),
        c.NodeGpu(3, "MIG-b", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9, 9728, parent_uuid="GPU-p", parent_index=1,
                  mig_profile="1g.10gb"),
    ))
    doc = json.loads(inv.render())
    assert "parent" not in doc["gpus"][0]
    assert doc["gpus"][1]["parent"] == "GPU-p" and doc["gpus"][1]["parentIndex"] == 1
    assert doc["gpus"][1]["migProfile"] == "1g.10gb"
    assert c.parse_inventory(inv.render()) == inv


def test_an_annotation_without_mig_fields_parses_as_whole_gpus() -> None:
    text = '{"mode":"core_mem","gpus":[{"index":0,"uuid":"GPU-a","memUnits":15}]}'
    gpu = c.parse_inventory(text).gpus[0]
    assert (gpu.parent_uuid, gpu.parent_index, gpu.mig_profile) == ("", None, "")
