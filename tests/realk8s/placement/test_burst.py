"""Bursts of pods created at once, with the extender (issue 14, defect 0): kube-scheduler binds them within
milliseconds, the extender's binds run in parallel, and each node's kubelet admits them one at a time in the order
they reach it. Every container must get the GPU recorded for it, on one GPU, with the envs of its own record.
Rounds where many pods ask the same amount matter most: a call's amount cannot tell them apart. On a loaded machine
a container's pod lookup can outlast its budget: it is placed by node-local pairing and named later, and its record
must still say all of what the kubelet gave it (tests/allocation/test_identity_lookup_timeout.py has that case
deterministically). And each container, from inside, sees exactly the GPU and slice of its record
(tests/realk8s/inside.py)."""

from __future__ import annotations

import random

import pytest

from tests.realk8s.cluster import Cluster
from tests.realk8s.inside import pod_sees_what_it_was_given
from tests.realk8s.podspecs import Ask, on_node, pod, settled, wait_pods

pytestmark = pytest.mark.realk8s

BURST = 24
# the bursts (1..24 GiB at 30 %), then pods that ask alike: a call's amount cannot tell them apart
ROUNDS = [lambda rng: rng.randint(1, 24), lambda rng: 8, lambda rng: rng.choice((4, 8))]


def test_bursts_of_pods_each_get_the_gpu_recorded_for_them(realk8s: Cluster, ns: str) -> None:
    rng = random.Random(0)
    node = realk8s.nodes[0].name
    for r, mem in enumerate(ROUNDS + [lambda rng: 70]):
        last = r == len(ROUNDS)  # eight pods of 70 GiB for one node: one GPU each
        names = [f"b{r}-{i:02d}" for i in range(8 if last else BURST)]
        for name in names:
            body = pod(name, [Ask(mem=mem(rng), core=5 if last else 30)])
            realk8s.core.create_namespaced_pod(ns, on_node(body, node) if last else body)
        pods = wait_pods(realk8s.core, ns, lambda ps, names=names: sum(
            1 for p in ps if p.metadata.name in names and settled(p)) == len(names), f"round {r} settled", 90)
        refused = [p.metadata.name for p in pods if p.status.phase == "Failed"]
        assert refused == [], f"round {r}: refused by their node: {refused}"
        assert realk8s.audit() == [], f"round {r}"
        inside = [bad for p in pods if p.metadata.name in names for bad in pod_sees_what_it_was_given(realk8s, p)]
        assert inside == [], f"round {r}"
        for name in names:
            realk8s.core.delete_namespaced_pod(name, ns)
        wait_pods(realk8s.core, ns, lambda ps: ps == [], f"round {r} deleted", 60)
