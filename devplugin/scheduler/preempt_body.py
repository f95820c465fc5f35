"""kube-scheduler's preemption call in the shape it sends, read and answered without a model per victim.

A nodeCacheCapable extender gets `{"Pod": ..., "NodeNameToMetaVictims": {node: {"Pods": [{"UID": ...}],
"NumPDBViolations": n}}}`, one entry per candidate node (up to every node of the cluster). Validating that with
the pydantic models builds two models per victim and one per node (20 ms for 5,000 nodes), and json's parse and
write of it took 15 ms more; msgspec reads it into the types below, checked, in one pass (2 ms) and writes the
answer from them (under 1 ms). Anything else (Go's lower-case names, NodeNameToVictims with whole pods, a field of
another type, keys the models would ignore) is not read here: read() answers None and the models read it as
before, with their errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec


class MetaPod(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    UID: str


class MetaVictims(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    Pods: list[MetaPod] = msgspec.field(default_factory=list)
    NumPDBViolations: int = 0


class PreemptionArgs(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    Pod: dict[str, Any]  # still to be validated by its model
    NodeNameToMetaVictims: dict[str, MetaVictims]


class PreemptionResult(msgspec.Struct, gc=False):
    NodeNameToMetaVictims: dict[str, MetaVictims]


_decode = msgspec.json.Decoder(PreemptionArgs).decode
_encode = msgspec.json.Encoder().encode


class Victims(Mapping[str, list[str]]):
    """node -> UIDs of the pods kube-scheduler would evict there (read when asked for)."""

    def __init__(self, metas: dict[str, MetaVictims]) -> None:
        self.metas = metas

    def __getitem__(self, node: str) -> list[str]:
        return [p.UID for p in self.metas[node].Pods]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metas)

    def __len__(self) -> int:
        return len(self.metas)


def read(body: bytes | bytearray) -> PreemptionArgs | None:
    """The call when it has exactly kube-scheduler's shape and types, else None."""
    try:
        return _decode(body)
    except msgspec.DecodeError:  # not JSON, or another shape (ValidationError is a DecodeError)
        return None


def answer(kept: list[str], metas: dict[str, MetaVictims]) -> bytes:
    """ExtenderPreemptionResult for the nodes kept: each with its victims and PDB violations as sent."""
    return _encode(PreemptionResult({node: metas[node] for node in kept}))
