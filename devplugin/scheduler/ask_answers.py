"""filter's and prioritize's answers for one share, kept per ask across calls and brought up to date node by node.

kube-scheduler sends every pending GPU pod's filter and prioritize the same thousands of node names, and pods of one
workload ask for the same share. What a node answers a share of `mem` and `core` changes only when the node or a pod
on it changes, which the cluster state records as a list of changed node names (ClusterState._changed). So for each
of the last few asks (mem, core) the state keeps an AskAnswers: the nodes that refuse the share, with their words,
and every node's entry of prioritize's answer. A call first applies the changes recorded since the ask's last call
(one node per bind, typically), then answers with a few passes over the names done by the interpreter's set and
list primitives, instead of a per-node lookup, binary search and score in Python for every name.

The answers are one_share's, node by node (node_answer, node_score): tests/scheduler/test_ask_answers.py compares
them with the answers computed afresh on clusters that change between calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from devplugin.allocation.unreserved import MODE as CORE_MODE
from devplugin.allocation.unreserved import core_needed
from devplugin.scheduler.one_share import (
    FAIL,
    NOT_SEEN,
    PASS,
    ShareIndex,
    node_answer,
    node_score,
    score_entry,
    unseen_entry,
)

MAX_TEXTS = 4096  # distinct refusal texts kept per ask
MAX_ASKS = 16  # asks kept: each holds an entry per node (about 100 bytes), so 16 x 5,000 nodes is about 8 MB


@dataclass(slots=True)
class AskAnswers:
    """What every known node answers one share of `mem` and `core`, as of the state's change `seen`."""

    mem: int
    core: int
    seen: int = -1  # the state's change count these answers include
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)  # node -> (FAIL or UNRESOLVABLE, why)
    entries: dict[str, str] = field(default_factory=dict)  # node -> its entry of prioritize's answer
    memo: dict[tuple, str] = field(default_factory=dict)  # refusal texts, shared by the nodes that give them
    need_core_mode: int = 0

    def __post_init__(self) -> None:
        self.need_core_mode = core_needed(CORE_MODE, self.mem, self.core)

    def update(self, name: str, ix: ShareIndex | None) -> None:
        """Node `name` now has index `ix` (None: it is gone)."""
        if ix is None:
            self.refused.pop(name, None)
            self.entries.pop(name, None)
            return
        if len(self.memo) > MAX_TEXTS:
            self.memo.clear()
        kind, why = self.answer(ix)
        if kind == PASS:
            self.refused.pop(name, None)
        else:
            self.refused[name] = (kind, why)
        self.entries[name] = score_entry(ix, node_score(ix, self.mem, self.core, self.need_core_mode))

    def answer(self, ix: ShareIndex) -> tuple[int, str]:
        return node_answer(ix, self.mem, self.core, self.need_core_mode, self.memo)

    def filter(self, names: Sequence[str], known: Mapping[str, object], own: tuple[str, ShareIndex] | None = None
               ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(passed, failed, unresolvable) for `names`, in their order; `known`: the state's nodes (others fail as
        not seen); `own`: the node where the asking pod is held, with its index leaving the pod out."""
        wanted = set(names)
        odd = wanted.difference(known)
        odd.update(wanted.intersection(self.refused))
        own_name, own_answer = "", (PASS, "")
        if own is not None and own[0] in wanted:
            own_name, own_answer = own[0], self.answer(own[1])
            odd.add(own_name)
        if not odd:
            return list(names), {}, {}
        if own_name and own_answer[0] == PASS:
            passed = [n for n in names if n not in odd or n == own_name]
        else:
            passed = [n for n in names if n not in odd]
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for n in [n for n in names if n in odd]:
            if n == own_name:
                kind, why = own_answer
            elif n not in known:
                kind, why = FAIL, NOT_SEEN
            else:
                kind, why = self.refused[n]
            if kind == FAIL:
                failed[n] = why
            elif kind != PASS:
                unresolvable[n] = why
        return passed, failed, unresolvable

    def scores_json(self, names: Sequence[str], own: tuple[str, ShareIndex] | None = None) -> str:
        """prioritize's answer for `names`: [{"Host": name, "Score": score}, ...] as json.dumps writes it."""
        get = self.entries.get
        parts = [e if (e := get(n)) is not None else unseen_entry(n) for n in names]
        if own is not None:
            name, ix = own
            mine = score_entry(ix, node_score(ix, self.mem, self.core, self.need_core_mode))
            for i, n in enumerate(names):
                if n == name:
                    parts[i] = mine
        return "[" + ", ".join(parts) + "]"
