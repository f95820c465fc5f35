"""kube-scheduler's filter and prioritize calls in the shape a nodeCacheCapable extender gets them, read with msgspec,
and filter's answer written with it.

The call is `{"Pod": ..., "NodeNames": [...]}` with every node that passed kube-scheduler's own checks (5,000 names
in a cluster of 5,000 nodes at percentageOfNodesToScore 100). msgspec reads the names in one pass without a model
(the pod is still validated by its pydantic model), and writes filter's answer (NodeNames, FailedNodes,
FailedAndUnresolvableNodes, Error) as the model wrote it. A body of any other shape (Go's lower-case names, Node
objects instead of names, keys the models would ignore, a field of another type) is not read here: read() answers
None and the models read it as before, with their errors.
"""

from __future__ import annotations

from typing import Any

import msgspec


class NamesArgs(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    Pod: dict[str, Any]  # still to be validated by its model
    NodeNames: list[str]


class FilterResult(msgspec.Struct, gc=False):
    """ExtenderFilterResult without Nodes, in the order and with the fields its model writes."""

    NodeNames: list[str]
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str = ""


_decode = msgspec.json.Decoder(NamesArgs).decode
_encode = msgspec.json.Encoder().encode


def read(body: bytes | bytearray) -> NamesArgs | None:
    """The call when it has exactly kube-scheduler's shape and types, else None."""
    try:
        return _decode(body)
    except msgspec.DecodeError:  # not JSON, or another shape (ValidationError is a DecodeError)
        return None


def filter_answer(passed: list[str], failed: dict[str, str], unresolvable: dict[str, str]) -> bytes:
    return _encode(FilterResult(passed, failed, unresolvable))
