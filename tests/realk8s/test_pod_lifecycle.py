"""The node agent's container runtime as a kubelet user meets it: exit codes and restartPolicy, crash-loop back-off,
init containers to completion before the app containers, sidecars kept running, termination with the grace period,
images the node does not have, commands that do not exist, missing ConfigMaps, volumes, the pod network, exec and
logs. Every test ends with nothing of its pods left on the nodes (the `ns` fixture checks containers, mounts,
network namespaces and processes)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.realk8s.cluster import Cluster
from tests.realk8s.images import PLAIN_IMAGE

pytestmark = pytest.mark.realk8s


def bare(name: str, containers: list[dict[str, Any]], restart: str = "Never", **spec: Any) -> dict[str, Any]:
    """A pod of the plain image (no GPU) with these containers."""
    for c in containers:
        c.setdefault("image", PLAIN_IMAGE)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": containers, "restartPolicy": restart, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 5, **spec}}


def sh(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": ["sh", "-c", script], **extra}


def until(cluster: Cluster, ns: str, name: str, cond: Any, what: str, timeout: float = 60) -> k8s.V1Pod:
    deadline = time.monotonic() + timeout
    while True:
        p = cluster.core.read_namespaced_pod(name, ns)
        if cond(p):
            return p
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} not {what} within {timeout:.0f} s: phase {p.status.phase}, "
                                 f"init {p.status.init_container_statuses}, containers {p.status.container_statuses}")
        time.sleep(0.2)


def status_of(p: k8s.V1Pod, container: str) -> k8s.V1ContainerStatus:
    return next(s for s in (p.status.container_statuses or []) + (p.status.init_container_statuses or [])
                if s.name == container)


def test_a_container_that_exits_with_an_error_fails_the_pod_with_its_exit_code(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, bare("exit3", [sh("c", "echo bye; exit 3")]))
    p = until(realk8s, ns, "exit3", lambda p: p.status.phase == "Failed", "Failed")
    t = status_of(p, "c").state.terminated
    assert (t.exit_code, t.reason) == (3, "Error")
    assert realk8s.container_logs(ns, "exit3", "c") == "bye\n"


def test_a_container_that_succeeds_completes_the_pod(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, bare("ok", [sh("c", "true")]))
    p = until(realk8s, ns, "ok", lambda p: p.status.phase == "Succeeded", "Succeeded")
    t = status_of(p, "c").state.terminated
    assert (t.exit_code, t.reason) == (0, "Completed")
    assert next(c for c in p.status.conditions if c.type == "Ready").reason == "PodCompleted"


def test_on_failure_restarts_a_failed_container_after_the_back_off(realk8s: Cluster, ns: str) -> None:
    script = "if [ -e /work/tried ]; then echo second; exit 0; fi; touch /work/tried; echo first; exit 1"
    body = bare("retry", [sh("c", script, volumeMounts=[{"name": "w", "mountPath": "/work"}])], restart="OnFailure",
                volumes=[{"name": "w", "emptyDir": {}}])
    realk8s.core.create_namespaced_pod(ns, body)
    backing_off = until(realk8s, ns, "retry",
                        lambda p: p.status.container_statuses and status_of(p, "c").state.waiting is not None
                        and status_of(p, "c").state.waiting.reason == "CrashLoopBackOff", "in CrashLoopBackOff")
    assert "back-off 10s restarting failed container=c" in status_of(backing_off, "c").state.waiting.message
    assert status_of(backing_off, "c").last_state.terminated.exit_code == 1
    p = until(realk8s, ns, "retry", lambda p: p.status.phase == "Succeeded", "Succeeded", timeout=60)
    s = status_of(p, "c")
    assert s.restart_count == 1 and s.state.terminated.exit_code == 0
    assert s.last_state.terminated.exit_code == 1
    assert realk8s.container_logs(ns, "retry", "c") == "second\n"
    assert realk8s.container_logs(ns, "retry", "c", previous=True) == "first\n"


def test_init_containers_run_in_order_to_completion_before_the_app_container(realk8s: Cluster, ns: str) -> None:
    mounts = [{"name": "w", "mountPath": "/work"}]
    body = bare("init", [sh("app", "cat /work/order; sleep 3600", volumeMounts=mounts)], restart="Always",
                volumes=[{"name": "w", "emptyDir": {}}],
                initContainers=[{"image": PLAIN_IMAGE, **sh("first", "echo first >> /work/order", volumeMounts=mounts)},
                                {"image": PLAIN_IMAGE, **sh("second", "echo second >> /work/order",
                                                             volumeMounts=mounts)}])
    realk8s.core.create_namespaced_pod(ns, body)
    p = until(realk8s, ns, "init", lambda p: p.status.phase == "Running", "Running")
    assert [s.state.terminated.reason for s in p.status.init_container_statuses] == ["Completed", "Completed"]
    deadline = time.monotonic() + 10
    while realk8s.container_logs(ns, "init", "app") != "first\nsecond\n" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert realk8s.container_logs(ns, "init", "app") == "first\nsecond\n"


def test_a_failed_init_container_fails_the_pod_and_no_app_container_starts(realk8s: Cluster, ns: str) -> None:
    body = bare("badinit", [sh("app", "echo ran")],
                initContainers=[{"image": PLAIN_IMAGE, **sh("setup", "exit 7")}])
    realk8s.core.create_namespaced_pod(ns, body)
    p = until(realk8s, ns, "badinit", lambda p: p.status.phase == "Failed", "Failed")
    assert status_of(p, "setup").state.terminated.exit_code == 7
    assert status_of(p, "app").state.running is None and status_of(p, "app").state.terminated is None


def test_a_sidecar_runs_beside_the_app_container_and_stops_when_it_ends(realk8s: Cluster, ns: str) -> None:
    body = bare("side", [sh("app", "sleep 2; echo done")],
                initContainers=[{"image": PLAIN_IMAGE, "restartPolicy": "Always", **sh("proxy", "sleep 3600")}])
    realk8s.core.create_namespaced_pod(ns, body)
    p = until(realk8s, ns, "side", lambda p: p.status.phase == "Running", "Running")
    assert status_of(p, "proxy").state.running is not None and status_of(p, "proxy").ready
    p = until(realk8s, ns, "side", lambda p: p.status.phase == "Succeeded", "Succeeded")
    assert status_of(p, "app").state.terminated.exit_code == 0
    assert status_of(p, "proxy").state.terminated is not None


def test_an_image_the_node_does_not_have_waits_in_err_image_pull(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, bare("nopull", [{"name": "c", "image": "registry.invalid/none:1"}]))
    p = until(realk8s, ns, "nopull", lambda p: p.status.container_statuses and status_of(p, "c").state.waiting
              and status_of(p, "c").state.waiting.reason == "ErrImagePull", "in ErrImagePull")
    assert p.status.phase == "Pending"
    msg = status_of(p, "c").state.waiting.message
    assert 'image "registry.invalid/none:1"' in msg and "image table" in msg, msg
    p = until(realk8s, ns, "nopull", lambda p: status_of(p, "c").state.waiting.reason == "ImagePullBackOff",
              "in ImagePullBackOff", timeout=30)
    assert "Back-off pulling image" in status_of(p, "c").state.waiting.message


def test_a_command_that_does_not_exist_is_a_start_error(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, bare("nocmd", [{"name": "c", "command": ["/no/such/binary"]}]))
    p = until(realk8s, ns, "nocmd", lambda p: p.status.phase == "Failed", "Failed")
    t = status_of(p, "c").state.terminated
    assert t.reason == "StartError" and t.exit_code == 128
    assert "/no/such/binary" in t.message and "no such file or directory" in t.message, t.message


def test_a_missing_config_map_is_a_create_container_config_error(realk8s: Cluster, ns: str) -> None:
    c = sh("c", "true", env=[{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}])
    realk8s.core.create_namespaced_pod(ns, bare("nocm", [c]))
    p = until(realk8s, ns, "nocm", lambda p: p.status.container_statuses and status_of(p, "c").state.waiting
              and status_of(p, "c").state.waiting.reason == "CreateContainerConfigError", "in its config error")
    assert status_of(p, "c").state.waiting.message == 'configmap "absent" not found'
    realk8s.core.create_namespaced_config_map(ns, {"metadata": {"name": "absent"}, "data": {"k": "v"}})
    p = until(realk8s, ns, "nocm", lambda p: p.status.phase == "Succeeded", "Succeeded once the ConfigMap exists",
              timeout=40)


def test_a_volume_that_cannot_be_mounted_keeps_the_pod_creating(realk8s: Cluster, ns: str) -> None:
    body = bare("nomount", [sh("c", "true")], volumes=[{"name": "cfg", "configMap": {"name": "absent"}}])
    realk8s.core.create_namespaced_pod(ns, body)
    p = until(realk8s, ns, "nomount", lambda p: p.status.container_statuses and status_of(p, "c").state.waiting
              and "MountVolume.SetUp failed" in (status_of(p, "c").state.waiting.message or ""), "waiting on its mount")
    w = status_of(p, "c").state.waiting
    assert w.reason == "ContainerCreating"
    assert w.message == 'MountVolume.SetUp failed for volume "cfg" : configmap "absent" not found'


def test_a_container_that_ignores_sigterm_is_killed_after_the_grace_period(realk8s: Cluster, ns: str) -> None:
    body = bare("stubborn", [sh("c", "trap '' TERM; echo up; while true; do sleep 0.1; done")],
                terminationGracePeriodSeconds=3)
    realk8s.core.create_namespaced_pod(ns, body)
    until(realk8s, ns, "stubborn", lambda p: p.status.phase == "Running", "Running")
    t0 = time.monotonic()
    realk8s.core.delete_namespaced_pod("stubborn", ns)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            realk8s.core.read_namespaced_pod("stubborn", ns)
        except k8s.ApiException as exc:
            assert exc.status == 404
            break
        time.sleep(0.1)
    took = time.monotonic() - t0
    assert 3 <= took < 10, f"deleted after {took:.1f} s with a 3 s grace period"


def test_volumes_env_and_the_service_account_token_are_what_the_pod_asks(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"greeting": "hello"}})
    realk8s.core.create_namespaced_secret(ns, {"metadata": {"name": "sec"},
                                               "data": {"pw": base64.b64encode(b"s3cret").decode()}})
    c = sh("c", "sleep 3600", env=[
        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "COMBINED", "value": "$(FROM_CM)-$(POD_NS)"}],
        volumeMounts=[{"name": "cfg", "mountPath": "/cfg"}, {"name": "sec", "mountPath": "/sec", "readOnly": True}])
    body = bare("vols", [c], volumes=[{"name": "cfg", "configMap": {"name": "cfg"}},
                                      {"name": "sec", "secret": {"secretName": "sec"}}])
    body["spec"]["automountServiceAccountToken"] = True
    realk8s.core.create_namespaced_pod(ns, body)
    p = until(realk8s, ns, "vols", lambda p: p.status.phase == "Running", "Running")
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    out = realk8s.exec(ns, "vols", "c", ["sh", "-c", "echo $FROM_CM $POD_NS $POD_IP $COMBINED; cat /cfg/greeting; "
                                                     f"echo; cat /sec/pw; echo; cat {sa}/namespace; "
                                                     f"echo; cut -d. -f2 {sa}/token"])
    assert out["exitCode"] == 0, out
    lines = out["stdout"].splitlines()
    assert lines[0] == f"hello {ns} {p.status.pod_ip} hello-{ns}"
    assert lines[1:4] == ["hello", "s3cret", ns]
    claims = json.loads(base64.urlsafe_b64decode(lines[4] + "=" * (-len(lines[4]) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{ns}:default"
    assert claims["kubernetes.io"]["pod"]["name"] == "vols"


def test_a_read_only_root_filesystem_cannot_be_written(realk8s: Cluster, ns: str) -> None:
    c = sh("c", "sleep 3600", securityContext={"readOnlyRootFilesystem": True})
    realk8s.core.create_namespaced_pod(ns, bare("ro", [c], restart="Always"))
    until(realk8s, ns, "ro", lambda p: p.status.phase == "Running", "Running")
    out = realk8s.exec(ns, "ro", "c", ["sh", "-c", "touch /etc/x 2>&1; touch /usr/x 2>&1; echo $?"])
    assert "Read-only file system" in out["stdout"] and out["stdout"].strip().endswith("1"), out


def test_exec_runs_in_the_container_and_reports_the_exit_code(realk8s: Cluster, ns: str) -> None:
    realk8s.core.create_namespaced_pod(ns, bare("ex", [sh("c", "sleep 3600")], restart="Always"))
    until(realk8s, ns, "ex", lambda p: p.status.phase == "Running", "Running")
    out = realk8s.exec(ns, "ex", "c", ["sh", "-c", "hostname; echo oops >&2; exit 4"])
    assert (out["exitCode"], out["stdout"], out["stderr"]) == (4, "ex\n", "oops\n")
    missing = realk8s.exec(ns, "ex", "c", ["/no/such/tool"])
    assert missing["exitCode"] != 0 and "/no/such/tool" in (missing.get("error") or missing["stderr"]), missing


def test_containers_outlive_a_restart_of_their_node_agent_and_keep_their_volumes(realk8s: Cluster, ns: str) -> None:
    """As containers outlive a kubelet's restart: the restarted node agent adopts the running container (the same
    container, no restart) and sets the pod's volumes up again without taking them from under it."""
    realk8s.core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"greeting": "hello"}})
    node = realk8s.nodes[-1]
    body = bare("kept", [sh("c", "sleep 3600", volumeMounts=[{"name": "cfg", "mountPath": "/cfg"}])],
                restart="Always", volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}], nodeName=node.name)
    realk8s.core.create_namespaced_pod(ns, body)
    before = until(realk8s, ns, "kept", lambda p: p.status.phase == "Running", "Running")
    node.agent.restart(timeout=60)
    try:  # the restarted agent serves its API at once and reads its pods from the apiserver a moment later
        node.agent.wait_books(lambda b: any(p["name"] == "kept" for p in b["pods"]), timeout=30)
        out = realk8s.exec(ns, "kept", "c", ["cat", "/cfg/greeting"])
        assert (out["exitCode"], out["stdout"]) == (0, "hello"), out
        after = realk8s.core.read_namespaced_pod("kept", ns)
        assert after.status.phase == "Running"
        assert status_of(after, "c").restart_count == 0
        assert status_of(after, "c").container_id == status_of(before, "c").container_id
    finally:
        realk8s.wait_node_serving(node, timeout=90)  # its daemon registers again with the restarted agent
