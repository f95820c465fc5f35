"""The names of a node's ResourceSlices (devplugin/dra/slice_names.py): a node owns its first-tried names and the
alternatives it takes when one is held by someone else, and no other node name owns any of them, however the
names are chosen (the slice policy lets a node's plugin create only names its node owns)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from devplugin.dra.slice_names import alternative_name, primary_of, slice_names

LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z")
NODE = st.lists(LABEL, min_size=1, max_size=3).map(".".join)


@given(NODE, NODE)
@example("node", "node-gpushare-counters")
@example("a", "a-gpushare-devices-0123abcd")
@example("a-gpushare", "a")
@example("a", "a-gpushare-counters-gpushare")
def test_no_other_node_owns_a_nodes_slice_names(node: str, other: str) -> None:
    for primary in slice_names(node):
        for name in (primary, alternative_name(primary)):
            assert primary_of(node, name) == primary
            if other != node:
                assert primary_of(other, name) is None, f"node {other} would own {name} of node {node}"


def test_alternative_names_are_the_first_name_and_8_hex_digits_each_time_new() -> None:
    primary = slice_names("gpu-7")[1]
    names = {alternative_name(primary) for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert name.startswith("gpu-7-gpushare-devices-") and len(name) == len(primary) + 9
        assert primary_of("gpu-7", name) == primary
    for taken in ("gpu-7-gpushare-devices-0123ABCD", "gpu-7-gpushare-devices-0123abc", "gpu-7-gpushare-gpus",
                  "gpu-7-gpushare-devices-0123abcd-x", "gpu-8-gpushare-devices"):
        assert primary_of("gpu-7", taken) is None, taken


def test_a_node_name_too_long_for_its_slice_names_is_refused() -> None:
    assert slice_names("n" * 226)[0] == "n" * 226 + "-gpushare-counters"
    with pytest.raises(ValueError, match=r"node name 'n{227}' is 227 characters: its ResourceSlice names would pass "
                                         r"the 253 characters a name may have; a node served through DRA needs a "
                                         r"name of at most 226 characters"):
        slice_names("n" * 227)
