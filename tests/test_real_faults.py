"""Faults during churn on a cluster of the test's own: a node daemon SIGKILLed and restarted, a node agent (the
kubelet) restarted, kube-apiserver stopped for 10 s, the extender restarted, each while a burst of pods is in
flight. Afterwards nothing is given twice, nothing is forgotten (every container's devices and envs equal its
record), no pod is refused by a node, and no pod is left Pending while a node has room."""

from __future__ import annotations

import pytest

from tests.realk8s.churn import run_churn
from tests.realk8s.cluster import Cluster

pytestmark = pytest.mark.realk8s


def inject(cluster: Cluster) -> object:
    def fault(burst: int) -> None:
        if burst == 1:
            node = cluster.nodes[0]
            node.daemon.kill()
            node.start_daemon()
            node.wait_daemon_ready()
        elif burst == 3:
            node = cluster.nodes[1]
            node.agent.stop()
            node.start_agent()
            node.wait_daemon_ready()
        elif burst == 5:
            cluster.restart_apiserver(down_s=10)
        elif burst == 7:
            ext = cluster.procs["devplugin-scheduler"]
            ext.stop()
            cluster.start_extender()
    return fault


@pytest.mark.xfail(strict=False, reason=(
    "issue 14, found by this harness (not among its listed defects): pods the extender binds to a node while its "
    "node daemon (or node agent) restarts are refused by the kubelet ('no healthy devices present; cannot "
    "allocate unhealthy devices'): the kubelet's device manager rejects, for good, a pod it admits while the "
    "plugin is not registered (kubernetes/kubernetes#109595, #119248: a hard reject by design, no retry), and a "
    "SIGKILLed daemon cannot tell the extender first. Not strict: it needs a bind inside the restart"))
def test_faults_during_churn_lose_nothing_and_give_nothing_twice(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster()
    ns = cluster.namespace("faults")
    res = run_churn(cluster.core, ns, cluster.books, seed=2024, pods=72, during=inject(cluster), settle_s=30,
                    delete_fraction=0.2)
    print(res.report("faults during churn, with the extender"))
    assert res.created == 72
    assert res.refused == [], "refused by a node although the extender placed them"
    assert res.pending_with_room == [], "left Pending while a node had room"
    assert cluster.audit() == []
