"""The annotations that choose or avoid GPUs by model and UUID: how they are read and what they allow."""

from __future__ import annotations

import uuid as uuidlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplugin import contract as c
from devplugin.allocation.gpu_selection import (
    MAX_ENTRIES,
    MAX_ENTRY_CHARS,
    MAX_VALUE_CHARS,
    NOTHING,
    SelectionError,
    exclusions,
    nothing_allowed,
    read_selection,
)

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
U1 = "GPU-5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90"
U2 = "GPU-11111111-2222-3333-4444-555555555555"

# a model entry as a user writes one: printable, no comma, not blank at either end
model_entry = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"),
                                    blacklist_characters=","), min_size=1, max_size=20)
gpu_uuid = st.uuids().map(lambda u: f"GPU-{u}")


def test_a_pod_without_the_annotations_allows_every_gpu() -> None:
    assert read_selection({"other": "x"}) is NOTHING
    assert NOTHING.why_excluded(A100, U1) == ""


def test_model_entries_match_the_nvml_name_as_a_substring_ignoring_case() -> None:
    sel = read_selection({c.ANN_USE_GPU_MODEL: " a100 , h100 80gb ,"})
    assert sel.use_models is not None and sel.use_models.values == ("a100", "h100 80gb")
    assert sel.why_excluded(A100, U1) == ""
    assert sel.why_excluded(H100, U1) == ""
    why = sel.why_excluded("Tesla V100-SXM2-16GB", U1)
    assert c.ANN_USE_GPU_MODEL in why and "V100" in why
    avoid = read_selection({c.ANN_AVOID_GPU_MODEL: "H100"})
    assert avoid.why_excluded(A100, U1) == ""
    assert "'H100'" in avoid.why_excluded(H100, U1) and c.ANN_AVOID_GPU_MODEL in avoid.why_excluded(H100, U1)


def test_uuid_entries_name_whole_gpus_ignoring_case() -> None:
    sel = read_selection({c.ANN_USE_GPU_UUID: f"{U1.upper().replace('GPU-', 'GPU-')},{U2}"})
    assert sel.why_excluded(A100, U1) == "" and sel.why_excluded(A100, U2) == ""
    assert "not named in gpushare.io/use-gpu-uuid" in sel.why_excluded(A100, "GPU-" + "0" * 8 + U1[12:])
    avoid = read_selection({c.ANN_AVOID_GPU_UUID: U2})
    assert avoid.why_excluded(A100, U2) == f"named in {c.ANN_AVOID_GPU_UUID}"


def test_every_annotation_given_must_allow_the_gpu() -> None:
    sel = read_selection({c.ANN_USE_GPU_MODEL: "H100", c.ANN_AVOID_GPU_UUID: U2})
    assert sel.why_excluded(H100, U1) == ""
    assert sel.why_excluded(H100, U2) != ""
    assert sel.why_excluded(A100, U1) != ""


@pytest.mark.parametrize(("ours", "hamis"), [
    (c.ANN_USE_GPU_MODEL, c.ANN_HAMI_USE_GPU_TYPE), (c.ANN_AVOID_GPU_MODEL, c.ANN_HAMI_NOUSE_GPU_TYPE),
    (c.ANN_USE_GPU_UUID, c.ANN_HAMI_USE_GPU_UUID), (c.ANN_AVOID_GPU_UUID, c.ANN_HAMI_NOUSE_GPU_UUID)])
def test_hamis_spelling_is_read_and_both_must_agree(ours: str, hamis: str) -> None:
    value, other = (f"{U1},{U2}", U2) if "uuid" in ours else ("A100,H100", "V100")
    alone = read_selection({hamis: value})
    assert [e.annotation for e in alone.parts] == [hamis]
    same = read_selection({ours: value, hamis: ",".join(reversed(value.lower().split(",")))})
    assert [e.annotation for e in same.parts] == [ours]
    with pytest.raises(SelectionError, match=f"annotations {ours}=.* and {hamis}=.* disagree"):
        read_selection({ours: value, hamis: other})


@pytest.mark.parametrize(("annotations", "says"), [
    ({c.ANN_USE_GPU_UUID: U1, c.ANN_AVOID_GPU_UUID: U1.upper().replace("GPU-", "GPU-")},
     f"{U1} is named both in {c.ANN_USE_GPU_UUID} and in {c.ANN_AVOID_GPU_UUID}"),
    ({c.ANN_USE_GPU_MODEL: "A100,H100 80GB", c.ANN_AVOID_GPU_MODEL: "h100"},
     f"{c.ANN_USE_GPU_MODEL} asks for 'H100 80GB' but {c.ANN_AVOID_GPU_MODEL} avoids 'h100'"),
    ({c.ANN_HAMI_USE_GPU_TYPE: "A100", c.ANN_HAMI_NOUSE_GPU_TYPE: "A100"}, "cannot be both chosen and avoided"),
    ({c.ANN_USE_GPU_UUID: "MIG-5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90"}, "a MIG instance's UUID"),
    ({c.ANN_AVOID_GPU_UUID: "MIG-GPU-5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90/1/0"}, "docs/guide/dra.md"),
    ({c.ANN_USE_GPU_UUID: "GPU-0"}, "is not a GPU UUID; write it as NVML"),
    ({c.ANN_USE_GPU_UUID: "5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90"}, "GPU- and 32 hex digits"),
    ({c.ANN_USE_GPU_MODEL: ""}, f"annotation {c.ANN_USE_GPU_MODEL} lists no GPU model"),
    ({c.ANN_AVOID_GPU_UUID: " , ,"}, "lists no GPU UUID; list at least one"),
    ({c.ANN_USE_GPU_MODEL: "A100\n"}, None),  # a trailing newline is space around the entry: allowed
    ({c.ANN_USE_GPU_MODEL: "A1\x0000"}, "holds a control or invisible character"),
    ({c.ANN_USE_GPU_MODEL: "A100\u200b"}, "holds a control or invisible character"),
    ({c.ANN_USE_GPU_MODEL: "x" * (MAX_ENTRY_CHARS + 1)}, f"a GPU model has at most {MAX_ENTRY_CHARS}"),
    ({c.ANN_USE_GPU_MODEL: ",".join(f"m{i}" for i in range(MAX_ENTRIES + 1))}, f"list at most {MAX_ENTRIES}"),
    ({c.ANN_AVOID_GPU_MODEL: "," * (MAX_VALUE_CHARS + 1)}, f"at most {MAX_VALUE_CHARS} are read"),
    ({c.ANN_USE_GPU_MODEL: 7}, "must be text"),
])
def test_malformed_or_contradictory_selections_are_refused_with_what_to_change(annotations: dict,
                                                                                says: str | None) -> None:
    if says is None:
        assert read_selection(annotations).use_models is not None
        return
    with pytest.raises(SelectionError) as exc:
        read_selection(annotations)
    assert says in str(exc.value)
    assert len(str(exc.value)) < 1000  # a hostile value is not echoed whole


def test_a_narrower_avoid_leaves_the_rest_of_a_model_allowed() -> None:
    sel = read_selection({c.ANN_USE_GPU_MODEL: "H100", c.ANN_AVOID_GPU_MODEL: "H100 PCIe"})
    assert sel.why_excluded(H100, U1) == ""
    assert sel.why_excluded("NVIDIA H100 PCIe", U1) != ""


@settings(max_examples=200, deadline=None)
@given(st.lists(model_entry, min_size=1, max_size=MAX_ENTRIES), st.sampled_from([", ", ",", " ,  ", ",,"]))
def test_listed_models_read_back_as_written(entries: list[str], sep: str) -> None:
    sel = read_selection({c.ANN_USE_GPU_MODEL: sep.join(entries)})
    assert sel.use_models is not None
    want: dict[str, str] = {}
    for e in entries:
        want.setdefault(e.casefold(), e)
    assert list(sel.use_models.values) == list(want.values())


@settings(max_examples=300, deadline=None)
@given(st.lists(model_entry, min_size=1, max_size=6), model_entry, st.booleans())
def test_the_match_rule_is_a_substring_of_the_product_name_ignoring_case(entries: list[str], model: str,
                                                                          use: bool) -> None:
    name = c.ANN_USE_GPU_MODEL if use else c.ANN_AVOID_GPU_MODEL
    sel = read_selection({name: ",".join(entries)})
    matches = any(e.casefold() in model.casefold() for e in entries)
    assert (sel.why_excluded(model, U1) == "") == (matches if use else not matches)


@settings(max_examples=200, deadline=None)
@given(st.lists(gpu_uuid, min_size=1, max_size=10), gpu_uuid)
def test_uuid_lists_allow_exactly_the_gpus_they_name(listed: list[str], other: str) -> None:
    use = read_selection({c.ANN_HAMI_USE_GPU_UUID: ",".join(u.lower() for u in listed)})
    avoid = read_selection({c.ANN_HAMI_NOUSE_GPU_UUID: ",".join(u.upper().replace("GPU-", "GPU-") for u in listed)})
    for u in listed:
        assert use.why_excluded("m", u) == "" and avoid.why_excluded("m", u) != ""
    if other.casefold() not in {u.casefold() for u in listed}:
        assert use.why_excluded("m", other) != "" and avoid.why_excluded("m", other) == ""


hostile = st.one_of(
    st.text(max_size=400),
    st.text(st.sampled_from(",\x00\t\n \u200b\u202eAaGPU-0f"), max_size=400),
    st.builds(lambda n, s: s * n, st.integers(0, 3000), st.sampled_from([",", "A100,", f"{U1},", "\x07,", " "])),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from([p for pair in (
        (c.ANN_USE_GPU_MODEL, c.ANN_HAMI_USE_GPU_TYPE, c.ANN_AVOID_GPU_MODEL, c.ANN_HAMI_NOUSE_GPU_TYPE,
         c.ANN_USE_GPU_UUID, c.ANN_HAMI_USE_GPU_UUID, c.ANN_AVOID_GPU_UUID, c.ANN_HAMI_NOUSE_GPU_UUID),)
        for p in pair]), hostile, max_size=8))
def test_hostile_values_are_read_or_refused_never_crash(annotations: dict[str, str]) -> None:
    try:
        sel = read_selection(annotations)
    except SelectionError as exc:
        assert any(name in str(exc) for name in annotations)
        assert str(exc).isprintable() and len(str(exc)) < 1200
        return
    for part in sel.parts:
        assert 1 <= len(part.values) <= MAX_ENTRIES
        assert all(v and v.isprintable() and len(v) <= MAX_ENTRY_CHARS and "," not in v for v in part.values)
    sel.why_excluded(A100, U1)


def test_a_node_whose_every_gpu_is_excluded_is_told_what_it_has() -> None:
    sel = read_selection({c.ANN_USE_GPU_MODEL: "H100"})
    gpus = [(i, f"GPU-{uuidlib.UUID(int=i)}", A100) for i in range(10)]
    assert set(exclusions(sel, [(u, m, "") for _, u, m in gpus])) == {u for _, u, _ in gpus}
    why = nothing_allowed(sel, gpus)
    assert "gpushare.io/use-gpu-model=H100" in why
    assert f"GPUs 0,1,2,3,4,5,6,7,8,9 {A100!r}" in why and "and 2 more" in why
    assert exclusions(sel, [(U1, H100, "")]) == {}


def test_a_gpus_uuid_chooses_or_avoids_its_mig_devices_and_a_profile_is_chosen_by_its_name() -> None:
    mig = "MIG-0f0d3a3e-6c4b-5b7e-9a43-2f1b6c7d8e90"
    name = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    assert read_selection({c.ANN_USE_GPU_UUID: U1}).why_excluded(name, mig, U1) == ""
    assert read_selection({c.ANN_USE_GPU_UUID: U2}).why_excluded(name, mig, U1) != ""
    assert read_selection({c.ANN_AVOID_GPU_UUID: U1}).why_excluded(name, mig, U1) == (
        f"named in {c.ANN_AVOID_GPU_UUID} (its GPU)")
    assert read_selection({c.ANN_USE_GPU_MODEL: "mig 1g.10gb"}).why_excluded(name, mig, U1) == ""
    assert read_selection({c.ANN_USE_GPU_MODEL: "mig 1g.10gb"}).why_excluded(A100, U1) != ""
    assert read_selection({c.ANN_AVOID_GPU_MODEL: "MIG"}).why_excluded(name, mig, U1) != ""
    assert read_selection({c.ANN_AVOID_GPU_MODEL: "MIG"}).why_excluded(A100, U2) == ""
