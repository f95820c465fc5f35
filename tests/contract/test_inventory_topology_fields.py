"""The node inventory annotation's optional topology fields (`nvlink`, `numa` per GPU): written when known, read
back, absent in older annotations, refused when malformed."""

from __future__ import annotations

import json

import pytest

from devplugin import contract as c


def inventory(*gpus: c.NodeGpu) -> c.NodeInventory:
    return c.NodeInventory(mode="core_mem", placement="binpack", mem_unit_mib=1024, gpus=gpus)


def test_island_and_numa_round_trip() -> None:
    inv = inventory(c.NodeGpu(0, "GPU-a", "A100", 80, 81920, nvlink_island=0, numa_node=1),
                    c.NodeGpu(1, "GPU-b", "A100", 80, 81920))
    doc = json.loads(inv.render())
    assert doc["gpus"][0]["nvlink"] == 0 and doc["gpus"][0]["numa"] == 1
    assert "nvlink" not in doc["gpus"][1] and "numa" not in doc["gpus"][1]
    assert c.parse_inventory(inv.render()) == inv


def test_an_annotation_without_them_still_parses() -> None:
    old = ('{"version":1,"mode":"core_mem","placement":"binpack","memUnitMiB":1024,'
           '"gpus":[{"index":0,"uuid":"GPU-a","model":"A100","memUnits":80,"memMiB":81920,"healthy":true}]}')
    gpu = c.parse_inventory(old).gpus[0]
    assert (gpu.nvlink_island, gpu.numa_node) == (None, None)


@pytest.mark.parametrize(("bad", "says"), [('"zero"', r"gpus\[0\]\.nvlink must be a whole number"),
                                          ("100000", r"gpus\[0\]\.nvlink is 100000"),
                                          ("1.5", "not a whole number"), ("-1", "whole number")])
def test_a_malformed_island_is_refused(bad: str, says: str) -> None:
    text = ('{"version":1,"mode":"core_mem","gpus":[{"index":0,"uuid":"GPU-a","memUnits":80,"nvlink":' + bad
            + "}]}")
    with pytest.raises(c.AnnotationError, match=says):
        c.parse_inventory(text)
