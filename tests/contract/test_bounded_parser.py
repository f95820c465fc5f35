"""Every reader of tenant-written values (devplugin.bounded and the contract's annotation parsers) answers any
text or JSON with either a parse whose numbers are within bounds, or a refusal that says what was wrong."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from devplugin import bounded as b
from devplugin import contract as c

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.sampled_from(["0", "1", "\u00b9", "-1", "index", "uuid", "mem", "core", "whole", "time", "node",
                         "containers", "main", "gpus", "mode", "memUnits", "healthy"]) | st.text(max_size=4),
        kids, max_size=5),
    max_leaves=25)
_PARSERS: list[Callable[[str], object]] = [
    c.parse_assignment, lambda t: c.parse_assignment(t, c.ANN_ALLOCATED), c.parse_inventory, c.parse_usage,
    c.parse_ack_allocation, lambda t: c.parse_assume_time(t, c.ANN_ALIYUN_ASSUME_TIME), c.parse_gpu_index]


def _numbers(value: object) -> list[int]:
    """Every int in a parsed result (dataclasses, mappings, tuples)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in _numbers(k) + _numbers(v)]
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _numbers(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [n for f in value.__dataclass_fields__ for n in _numbers(getattr(value, f))]
    return []


def _answer(parse: Callable[[str], object], text: str) -> None:
    try:
        out = parse(text)
    except c.AnnotationError as exc:
        assert str(exc).startswith("annotation "), str(exc)
        assert len(str(exc)) < 1000
        return
    assert all(0 <= n <= b.MAX_INT for n in _numbers(out)), out


@settings(max_examples=300, deadline=None)
@given(doc=_json)
@example(doc={"time": 1e999})
@example(doc={"0": {"0": -15}})
@example(doc={"containers": {"main": [{"index": 0, "mem": True}]}})
def test_any_json_gets_a_bounded_parse_or_a_refusal_from_every_annotation_parser(doc: object) -> None:
    text = json.dumps(doc)
    for parse in _PARSERS:
        _answer(parse, text)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40) | st.sampled_from(["1e999", "-0", "\u00b2", "\u00b9", "{\"0\":{\"0\":1e999}}",
                                                       "\u0661", "NaN", "Infinity", "1" * 30]))
def test_any_text_gets_a_bounded_parse_or_a_refusal_from_every_annotation_parser(text: str) -> None:
    for parse in _PARSERS:
        _answer(parse, text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.text(max_size=12) | st.from_regex(r"[+-]?[0-9]{0,4}(\.[0-9]{0,3})?([eE][+-]?[0-9]{1,4}|[KMGTPE]i|"
                                                  r"[numkMGTPE])?", fullmatch=True)
       | st.integers(-(2**70), 2**70) | st.booleans() | st.none() | st.floats())
@example(value="\u00b9")
@example(value="1e999999999999")
def test_any_quantity_is_a_whole_number_within_bounds_or_refused_with_the_field_named(value: object) -> None:
    try:
        n = b.whole_quantity(value, "container 'main': aliyun.com/gpu-mem")
    except b.RefusedValue as exc:
        assert str(exc).startswith("container 'main': aliyun.com/gpu-mem"), str(exc)
        return
    assert type(n) is int and 0 <= n <= b.MAX_AMOUNT


@pytest.mark.parametrize(("value", "expect"), [("1e1", 10), ("2M", 2_000_000), ("1Ki", 1024), ("+3", 3), ("4.0", 4),
                                               ("1.5k", 1500), ("0", 0), (7, 7), (" 5 ", 5)])
def test_quantities_the_apiserver_keeps_as_written_are_the_integers_they_stand_for(value: object, expect: int) -> None:
    assert b.whole_quantity(value, "q") == expect


@pytest.mark.parametrize(("value", "expect"), [
    ("0.5", "q: 0.5 is not a whole number (0.5); extended resources are counted in whole units"),
    ("100m", "q: 100m is not a whole number (0.1)"),
    ("1.5e0", "not a whole number (1.5)"),
    ("-2", "q: -2 is negative"),
    ("3Ei", "is more than 2147483647"),
    ("1ki", "is not a Kubernetes quantity"),
    ("\u00b9", "is not a Kubernetes quantity"),
    (1.0, "is not a Kubernetes quantity"),
])
def test_fractions_and_junk_quantities_are_refused_with_a_clear_message(value: object, expect: str) -> None:
    with pytest.raises(b.RefusedValue) as err:
        b.whole_quantity(value, "q")
    assert expect in str(err.value)
