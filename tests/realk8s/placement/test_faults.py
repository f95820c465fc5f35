"""Faults during churn on a cluster of the test's own: a node daemon SIGKILLed and restarted, a node agent (the
kubelet) restarted, kube-apiserver stopped for 10 s, the extender restarted, each while a burst of pods is in
flight. Afterwards nothing is given twice, nothing is forgotten (every container's devices and envs equal its
record), no pod is refused by a node, no pod is left Pending while a node has room, and every pod that runs sees
from inside exactly the GPUs and slices it was given (a Running pod of each burst, sampled as the churn goes, and
every pod Running at its end: tests/realk8s/inside.py)."""

from __future__ import annotations

import pytest

from tests.realk8s.churn import run_churn
from tests.realk8s.cluster import Cluster
from tests.realk8s.inside import Sampler, running_pods_see_what_they_were_given

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


# The kubelet's refusals of a pod it admits while the node daemon restarts: the plugin not registered yet,
# SIGKILLed during the kubelet's call to it, or registered again during that call (the kubelet closes the old
# endpoint's connection, and the call on it ends Canceled)
REFUSED_AT_RESTART = ("no healthy devices present", "rpc error: code = Unavailable desc = error reading from server",
                      "rpc error: code = Canceled desc = grpc: the client connection is closing")
KNOWN_REFUSAL = (
    "issue 14, found by this harness (not among its listed defects): pods the extender binds to a node while its "
    "node daemon (or node agent) restarts are refused by the kubelet ('no healthy devices present; cannot "
    "allocate unhealthy devices', or 'Unavailable ... error reading from server: EOF' when the daemon dies during "
    "the kubelet's call, or 'Canceled ... the client connection is closing' when it registers again during it): "
    "the kubelet's device manager rejects, for good, a pod it admits while the plugin is not "
    "registered or gone (kubernetes/kubernetes#109595, #119248: a hard reject by design, no retry), and a "
    "SIGKILLed daemon cannot tell the extender first. Not strict: it needs a bind inside the restart")


def test_faults_during_churn_lose_nothing_and_give_nothing_twice(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster()
    ns = cluster.namespace("faults")
    sampled = Sampler(cluster, seed=2024)
    res = run_churn(cluster.core, ns, cluster.books, seed=2024, pods=72, during=inject(cluster), settle_s=30,
                    delete_fraction=0.2, settled=sampled)
    print(res.report("faults during churn, with the extender"))
    assert res.created == 72
    assert res.pending_with_room == [], "left Pending while a node had room"
    assert cluster.audit() == []
    assert sampled.checked and sampled.found == [], sampled.found
    alive, found = running_pods_see_what_they_were_given(cluster, ns)
    print(f"from inside: {len(sampled.checked)} pods sampled during the churn, {alive} Running at its end")
    assert alive > 0 and found == []
    if res.refused and all(any(known in msg for known in REFUSED_AT_RESTART) for _, msg in res.refused):
        pytest.xfail(KNOWN_REFUSAL)  # the known refusal only: everything else above held
    assert res.refused == [], "refused by a node although the extender placed them"
