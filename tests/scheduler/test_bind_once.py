"""bind spends the pod's filter answer: the names a filter passed (thousands a pod in a large cluster) are not
kept once the pod is bound, and a repeated bind of a pod already bound (kube-scheduler's retry after a lost answer)
is refused before anything is assumed or written, so the first bind's room stays counted."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from devplugin.scheduler.extender import BindError, bind, filter_nodes
from devplugin.scheduler.state import ClusterState
from tests.support.scheduler_objects import node, pod


class Apiserver:
    """Binds a pod once; a second Binding of it is refused, as the apiserver refuses it (409)."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    def get_pod(self, namespace: str, name: str) -> dict:
        raise LookupError(name)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        if uid in self.bound:
            raise RuntimeError(f"pod {namespace}/{name} is already assigned to node {self.bound[uid]}")
        self.bound[uid] = node


def test_a_repeated_bind_is_refused_and_the_first_bind_stays_counted() -> None:
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=1, units=16)])
    p = pod("p", mem=10)
    state.replace_pods([p])
    uid = p["metadata"]["uid"]
    assert filter_nodes(state, p, ["n1"]).passed == ["n1"]
    apiserver = Apiserver()
    bind(state, apiserver, "default", "p", uid, "n1")
    assert [r.mem_used for r in state.view("n1").gpus] == [10]
    with pytest.raises(BindError, match="did not pass this extender's filter"):
        bind(state, apiserver, "default", "p", uid, "n1")  # the watch has not shown it bound yet
    assert [r.mem_used for r in state.view("n1").gpus] == [10], "the first bind's room is still held"
    assert not state.passed_filter(uid, "n1")
