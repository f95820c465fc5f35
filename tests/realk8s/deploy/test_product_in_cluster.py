"""The product as the shipped manifests run it, on the test cluster: the node daemon's DaemonSet (its install-shim
init container included) and the extender's Deployment as pods, from the product's own image built here from the
Dockerfile (tests/realk8s/product_image.py), with the shipped manifests adapted only where several nodes on one
machine force it (tests/realk8s/product_pods.py). A GPU pod is then placed by the extender's pod, admitted by the
daemon's pod, and sees its slice from inside; the webhooks answer from the extender's pod."""

from __future__ import annotations

import json
import os

import pytest
from kubernetes import client as k8s

from tests.realk8s.inside import GiB, View, sees_slice
from tests.realk8s.podspecs import Ask, pod, settled_and_recorded, wait_pods

pytestmark = [pytest.mark.realk8s,
              pytest.mark.skipif(os.geteuid() != 0, reason="runs containers and builds an image: needs root")]


def test_the_shipped_daemonset_and_extender_run_from_the_products_image(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(nodes=2, gpus=2, gpu_mib=16 * 1024, product_in_pods=True)
    core = cluster.core
    for node in cluster.nodes:
        daemon = core.read_namespaced_pod(f"gpushare-devplugin-{node.name}", "kube-system")
        assert daemon.status.phase == "Running", daemon.status
        (install,) = daemon.status.init_container_statuses
        assert (install.name, install.state.terminated.reason) == ("install-shim", "Completed")
        lib = node.root / "shim-install" / "lib" / "libgpushare.so"
        assert lib.read_bytes()[:4] == b"\x7fELF", "install-shim put the shim library on the node"
        assert daemon.status.container_statuses[0].image_id.startswith("sha256:")
    extender = core.read_namespaced_pod("devplugin-scheduler-0", "kube-system")
    assert extender.status.phase == "Running"
    lease = k8s.CoordinationV1Api(cluster.api_client).read_namespaced_lease("devplugin-scheduler", "kube-system")
    assert lease.spec.holder_identity == "devplugin-scheduler-0"  # its POD_NAME: the replica leads

    ns = cluster.namespace()
    core.create_namespaced_pod(ns, pod("share", [Ask(mem=4, core=30)]))
    (p,) = wait_pods(core, ns, lambda ps: ps and settled_and_recorded(ps[0]), "share Running with its record", 90)
    assert p.status.phase == "Running", (p.status.reason, p.status.message)
    record = json.loads(p.metadata.annotations["gpushare.io/allocated"])
    assert json.loads(p.metadata.annotations["gpushare.io/scheduled"])  # the extender's choice, written at bind
    uuids = [s["uuid"] for s in record["containers"]["c0"]]
    assert sees_slice(View(cluster.probe(ns, "share", "c0")), uuids, 4 * GiB, 30) == []
    # the daemon's pod logged the placement, naming the pod
    daemon_log = cluster.container_logs("kube-system", f"gpushare-devplugin-{p.spec.node_name}", "devplugin")
    assert f"{ns}/share" in daemon_log, daemon_log[-2000:]

    with pytest.raises(k8s.ApiException) as refused:
        core.create_namespaced_pod(ns, pod("bad", [Ask(mem=4, core=33)]))
    message = json.loads(refused.value.body)["message"]
    assert 'admission webhook "validate.gpushare.io" denied the request' in message
    assert "gpu-core.percentage 33 is not a valid compute share" in message
