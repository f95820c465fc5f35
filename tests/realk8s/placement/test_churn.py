"""Random churn over 4 nodes x 8 GPUs x 80 GiB with the real kube-scheduler, kubelet device managers and the
project's extender and node daemons: seeded pods of 1 or 2 containers (1..40 GiB, 5..60 %), a few whole GPUs,
pods deleted at random. With the extender nothing may go wrong; without it (the plain kube-scheduler, the same
seed) the refusals are counted and reported by cause, and what must hold anyway is checked. Either way, a Running
pod of each burst (sampled as the churn goes) and every pod still Running at its end sees from inside exactly the
GPUs and slices it was given (tests/realk8s/inside.py)."""

from __future__ import annotations

import pytest

from tests.realk8s.churn import run_churn
from tests.realk8s.cluster import Cluster
from tests.realk8s.inside import Sampler, running_pods_see_what_they_were_given

pytestmark = pytest.mark.realk8s

SEED = 1414


def daemon_lines_naming(cluster: Cluster, pods: list[str], most: int = 60) -> str:
    """The node daemons' log lines that name one of `pods` (the last `most`), for a failure's message."""
    found = []
    for node in cluster.nodes:
        if node.daemon is None or not node.daemon.log.exists():
            continue
        for line in node.daemon.log.read_text(errors="replace").splitlines():
            if any(p in line for p in pods):
                found.append(f"{node.name}: {line}")
    return "\n".join(found[-most:]) or "(none)"
PODS = 160
DELETE = 0.15  # of the running pods after each burst of 12: about 70 live, near the GPUs' compute


def test_churn_with_the_extender_refuses_nothing_and_gives_nothing_twice(realk8s: Cluster, ns: str) -> None:
    sampled = Sampler(realk8s, seed=SEED)
    res = run_churn(realk8s.core, ns, realk8s.books, seed=SEED, pods=PODS, delete_fraction=DELETE, settled=sampled)
    print(res.report("with the extender"))
    assert res.created == PODS and res.running > PODS // 2
    assert res.refused == [], ("refused by the node although the extender placed them; what the node daemons "
                               f"logged of them:\n{daemon_lines_naming(realk8s, [name for name, _ in res.refused])}")
    assert res.pending_with_room == [], "left Pending while a node had room"
    assert realk8s.audit() == []
    assert sampled.checked and sampled.found == [], sampled.found
    alive, found = running_pods_see_what_they_were_given(realk8s, ns)
    print(f"from inside: {len(sampled.checked)} pods sampled during the churn, {alive} Running at its end")
    assert alive > 0 and found == []


def test_churn_without_the_extender_counts_refusals_by_cause(realk8s: Cluster, ns: str) -> None:
    realk8s.use_scheduler(extender=False)
    sampled = Sampler(realk8s, seed=SEED)
    try:
        res = run_churn(realk8s.core, ns, realk8s.books, seed=SEED, pods=PODS, delete_fraction=DELETE,
                        settled=sampled)
    finally:
        realk8s.use_scheduler(extender=True)
    print(res.report("without the extender (plain kube-scheduler)"))
    assert res.created == PODS and res.running > PODS // 2
    # every refusal comes from a node's admission, with the device manager's reason
    assert all(msg.startswith("UnexpectedAdmissionError: ") for _, msg in res.refused), res.refused
    assert realk8s.audit() == []
    # what a node admitted, it gave: the pods that run see exactly that
    assert sampled.checked and sampled.found == [], sampled.found
    alive, found = running_pods_see_what_they_were_given(realk8s, ns)
    print(f"from inside: {len(sampled.checked)} pods sampled during the churn, {alive} Running at its end")
    assert alive > 0 and found == []
