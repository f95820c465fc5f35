"""The KubeRay operator (github.com/ray-project/kuberay/ray-operator, built by `make e2e-bin` into e2e/bin) on a
running test cluster (tests/realk8s/cluster.py), as its own release installs it, less the Deployment:

- its CRDs (RayCluster, RayJob, RayService) from the module's `config/crd/bases`, applied server-side (they are
  too large for the last-applied annotation of a client-side apply, as KubeRay's docs say);
- its RBAC from the module's `config/rbac` (`kubectl kustomize`: the ClusterRole, the ServiceAccount
  `kuberay-operator`, the bindings, the leader-election Role) in a namespace of its own;
- the operator as a process with a kubeconfig holding a token of that ServiceAccount, so its shipped RBAC is what
  it works with, and no leader election (one operator).

The Ray pods it creates run for real on the cluster's nodes (the image `gpushare.test/ray:2.60.0`,
tests/realk8s/images.py). Helpers here create RayClusters, wait for their pods, and run Ray jobs through the head's
dashboard (`ray job submit`, from inside the head container).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.realk8s import kubeconfigs, manifests
from tests.realk8s.cluster import Cluster
from tests.realk8s.images import RAY_VENV
from tests.realk8s.loopback import BIN
from tests.realk8s.processes import ComponentFailed, Proc, free_port

MODULE = "github.com/ray-project/kuberay/ray-operator"
VERSION = "v1.5.0"  # keep in step with KUBERAY_VERSION in the Makefile
OPERATOR = "ray-operator"
GROUP, API_VERSION, PLURAL = "ray.io", "v1", "rayclusters"
SERVICE_ACCOUNT = "kuberay-operator"


def missing() -> list[str]:
    """What the KubeRay tests need and this checkout lacks, each with the command that makes it."""
    out = []
    if not (BIN / OPERATOR).exists():
        out.append(f"{BIN / OPERATOR} (make e2e-bin)")
    if not (RAY_VENV / "bin" / "ray").exists():
        out.append(f"{RAY_VENV} (make ray-venv)")
    return out


def module_dir() -> Path:
    """The operator module's source in Go's module cache (downloaded by `make e2e-bin`), found from outside any
    module so that no go.mod or go.sum is touched."""
    go = shutil.which("go") or "/usr/local/go/bin/go"  # as the Makefile's GO
    proc = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], capture_output=True, text=True,
                          cwd=tempfile.gettempdir(), env={**os.environ, "GOFLAGS": ""})
    if proc.returncode != 0:
        raise ComponentFailed(f"go mod download {MODULE}@{VERSION} failed (run `make e2e-bin`, which downloads it): "
                              f"{proc.stderr.strip() or proc.stdout.strip()}")
    return Path(json.loads(proc.stdout)["Dir"])


def kubectl(admin: Path, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([manifests.kubectl(), "--kubeconfig", str(admin), *args], input=stdin,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def wait_established(admin: Path, crds: list[str], timeout: float = 60.0) -> None:
    """Until each CRD is Established. Polled with `kubectl get`, not `kubectl wait --for=condition=Established`:
    that fails at once, rather than waiting, on a CRD whose status the apiserver has not written yet ("status.conditions
    accessor error: <nil>", kubernetes/kubernetes#66439)."""
    deadline, states = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        for crd in crds:
            conditions = json.loads(kubectl(admin, "get", f"crd/{crd}", "-o", "json")).get("status", {}).get(
                "conditions") or []  # null until the apiserver writes them: no jsonpath filter copes with that
            states[crd] = next((c.get("status") for c in conditions if c.get("type") == "Established"), "none yet")
        if all(state == "True" for state in states.values()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"KubeRay's CRDs not Established within {timeout:.0f} s: {states}")


def rbac_objects(source: Path, namespace: str) -> list[dict[str, Any]]:
    """The module's config/rbac rendered by kubectl, its namespaced objects and its bindings' ServiceAccount
    subjects put in `namespace` (what the release's kustomization does with its `namespace:`)."""
    objs = manifests.render(source / "config" / "rbac")
    for obj in objs:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"]["namespace"] = namespace
        for subject in obj.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = namespace
    return objs


@dataclass
class Operator:
    """The running operator: its process, namespace and health port."""

    proc: Proc
    namespace: str
    health_port: int

    def stop(self) -> None:
        self.proc.stop()


def install(cluster: Cluster) -> Operator:
    """CRDs, RBAC and the operator on `cluster`; returns once the operator answers /readyz."""
    source = module_dir()
    kubectl(cluster.admin, "apply", "--server-side", "-f", str(source / "config" / "crd" / "bases"))
    wait_established(cluster.admin, [f"{p}.{GROUP}" for p in ("rayclusters", "rayjobs", "rayservices")])
    ns = cluster.namespace("kuberay")
    kubectl(cluster.admin, "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac_objects(source, ns)))
    assert cluster.pki is not None
    token = kubeconfigs.service_account_token(cluster.admin, ns, SERVICE_ACCOUNT)
    kc = kubeconfigs.write(cluster.root / "pki" / "kuberay-operator.kubeconfig", cluster.server, cluster.pki.ca.cert,
                           SERVICE_ACCOUNT, token=token)
    health = free_port()
    proc = Proc("kuberay-operator", [
        str(BIN / OPERATOR), f"--kubeconfig={kc}", "--enable-leader-election=false", "--metrics-addr=0",
        f"--health-probe-bind-address=127.0.0.1:{health}", "--log-stdout-encoder=console"],
        cluster.root / "logs" / "kuberay-operator.log")
    cluster.procs["kuberay-operator"] = proc  # its log among the cluster's when a test fails
    proc.start()
    proc.wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2).status == 200,
                    "ready (/readyz)", timeout=90)
    return Operator(proc, ns, health)


# --- RayClusters ---------------------------------------------------------------------------------------------------
def custom(cluster: Cluster) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(cluster.api_client)


def create(cluster: Cluster, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = custom(cluster).create_namespaced_custom_object(GROUP, API_VERSION, ns, PLURAL, body)
    return out


def get(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = custom(cluster).get_namespaced_custom_object(GROUP, API_VERSION, ns, PLURAL, name)
    return out


def patch(cluster: Cluster, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = custom(cluster).patch_namespaced_custom_object(GROUP, API_VERSION, ns, PLURAL, name, body)
    return out


def delete(cluster: Cluster, ns: str, name: str) -> None:
    custom(cluster).delete_namespaced_custom_object(GROUP, API_VERSION, ns, PLURAL, name)


def set_replicas(cluster: Cluster, ns: str, name: str, group: str, replicas: int) -> None:
    """Scale a worker group as a user does: edit its `replicas` in the RayCluster."""
    rc = get(cluster, ns, name)
    groups = rc["spec"]["workerGroupSpecs"]
    for g in groups:
        if g["groupName"] == group:
            g["replicas"] = replicas
    patch(cluster, ns, name, {"spec": {"workerGroupSpecs": groups}})


def pods(cluster: Cluster, ns: str, name: str, group: str | None = None) -> list[k8s.V1Pod]:
    """The cluster's pods (its head and workers), or one worker group's, not being deleted."""
    selector = f"ray.io/cluster={name}" + (f",ray.io/group={group}" if group else "")
    return [p for p in cluster.core.list_namespaced_pod(ns, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]


def running(p: k8s.V1Pod) -> bool:
    return p.status.phase == "Running" and all(c.ready for c in p.status.container_statuses or [])


def probes_pass(cluster: Cluster, p: k8s.V1Pod) -> bool:
    """Whether the readiness probes KubeRay puts on the pod's Ray container pass (the raylet's and, on the head, the
    GCS's health through the dashboard agent). The test nodes run no probes, so a Ray pod is Ready as soon as its
    containers run; this runs the probe's command in the container, as a kubelet would."""
    for c in p.spec.containers:
        probe = c.readiness_probe
        if probe is None or probe._exec is None:
            continue
        try:
            out = cluster.exec(p.metadata.namespace, p.metadata.name, c.name, list(probe._exec.command), timeout=30)
        except AssertionError:
            return False
        if out["exitCode"] != 0:
            return False
    return True


def wait(what: str, cond: Callable[[], Any], timeout: float, describe: Callable[[], str] = lambda: "",
         period: float = 1.0) -> Any:
    """Poll `cond` until it returns something true (returned); AssertionError naming `what` and `describe()`."""
    deadline = time.monotonic() + timeout
    while True:
        out = cond()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:.0f} s: {describe()}")
        time.sleep(period)


def describe(cluster: Cluster, ns: str, name: str) -> str:
    try:
        state = get(cluster, ns, name).get("status", {})
    except k8s.ApiException as exc:
        state = {"error": exc.status}
    ps = []
    for p in cluster.core.list_namespaced_pod(ns, label_selector=f"ray.io/cluster={name}").items:
        waiting = [(c.name, c.state.waiting.reason) for c in p.status.container_statuses or []
                   if c.state and c.state.waiting]
        ps.append(f"{p.metadata.name} on {p.spec.node_name or '-'}: {p.status.phase} waiting {waiting}")
    return f"RayCluster status {json.dumps(state)[:800]}; pods: {ps}"


def head_pod(cluster: Cluster, ns: str, name: str) -> str:
    [head] = [p for p in pods(cluster, ns, name) if (p.metadata.labels or {}).get("ray.io/node-type") == "head"]
    return str(head.metadata.name)


def ray_in_head(cluster: Cluster, ns: str, name: str, command: list[str], timeout: float = 120) -> dict[str, Any]:
    """Run a command in the head's Ray container (`kubectl exec`)."""
    return cluster.exec(ns, head_pod(cluster, ns, name), "ray-head", command, timeout=timeout)


NO_AGENT = "No available agent to submit job"  # the dashboard's answer before the head's agent registered


def _submitting(run: Callable[[], dict[str, Any]], timeout: float = 60) -> dict[str, Any]:
    """Run a `ray job submit` until the dashboard takes the job: it answers 500 "No available agent to submit
    job, please try again later" for a moment after the head's probes pass."""
    deadline = time.monotonic() + timeout
    while True:
        out = run()
        if NO_AGENT not in out["stdout"] + out["stderr"] or time.monotonic() > deadline:
            return out
        time.sleep(2)


def submit(cluster: Cluster, ns: str, name: str, script: str, args: list[str] | None = None,
           timeout: float = 300) -> str:
    """Submit `script` (with `args`) as a Ray job through the head's dashboard (`ray job submit`, from the head
    container: the script is written there first) and wait for it; its output (the driver's logs). AssertionError
    when the job did not succeed."""
    path = f"/tmp/job-{time.monotonic_ns()}.py"
    head = head_pod(cluster, ns, name)
    wrote = cluster.exec(ns, head, "ray-head", ["sh", "-c", f"cat > {path}"], stdin=script)
    assert wrote["exitCode"] == 0, wrote
    entry = " ".join(shlex.quote(a) for a in ["python", path, *(args or [])])
    cmd = f"ray job submit --address http://127.0.0.1:8265 -- {entry}"
    out = _submitting(lambda: cluster.exec(ns, head, "ray-head", ["sh", "-c", cmd], timeout=timeout))
    text = out["stdout"] + out["stderr"]
    assert out["exitCode"] == 0 and "succeeded" in text, f"the Ray job failed (exit {out['exitCode']}):\n{text[-6000:]}"
    return str(out["stdout"])


def start_job(cluster: Cluster, ns: str, name: str, script: str, args: list[str] | None = None) -> str:
    """Submit `script` as a Ray job without waiting for it (`ray job submit --no-wait`); its submission id."""
    head = head_pod(cluster, ns, name)
    job_id = f"job-{time.monotonic_ns()}"
    path = f"/tmp/{job_id}.py"
    wrote = cluster.exec(ns, head, "ray-head", ["sh", "-c", f"cat > {path}"], stdin=script)
    assert wrote["exitCode"] == 0, wrote
    entry = " ".join(shlex.quote(a) for a in ["python", path, *(args or [])])
    out = _submitting(lambda: cluster.exec(ns, head, "ray-head", [
        "sh", "-c", f"ray job submit --no-wait --address http://127.0.0.1:8265 --submission-id {job_id} -- {entry}"]))
    assert out["exitCode"] == 0, out
    return job_id


def job_status(cluster: Cluster, ns: str, name: str, job_id: str) -> str:
    """The job's status as `ray job status` names it (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    out = cluster.exec(ns, head_pod(cluster, ns, name), "ray-head",
                       ["ray", "job", "status", "--address", "http://127.0.0.1:8265", job_id])
    m = re.search(r"Status for job '[^']+': (\w+)", out["stdout"] + out["stderr"])
    return m.group(1) if m else f"unknown: {out}"


def job_logs(cluster: Cluster, ns: str, name: str, job_id: str) -> str:
    out = cluster.exec(ns, head_pod(cluster, ns, name), "ray-head",
                       ["ray", "job", "logs", "--address", "http://127.0.0.1:8265", job_id])
    return str(out["stdout"])


def pending_demands(cluster: Cluster, ns: str, name: str) -> str:
    """The `Pending Demands` part of `ray status` in the head: the resources of tasks Ray could not place."""
    out = ray_in_head(cluster, ns, name, ["ray", "status"])
    return str(out["stdout"]).partition("Pending Demands:")[2].strip()


def results(output: str, marker: str = "RESULT ") -> list[Any]:
    """The JSON values a job printed on lines starting with `marker`."""
    return [json.loads(line.split(marker, 1)[1]) for line in output.splitlines() if marker in line]


def gpu_usage(cluster: Cluster, node: str, gpu: int = 0) -> dict[str, Any]:
    """What the node daemon counts on one GPU of its Node (`gpushare.io/gpu-usage`): memory units, compute percent
    and containers placed there (zeros before anything was placed)."""
    ann = cluster.core.read_node(node).metadata.annotations or {}
    gpus = json.loads(ann.get("gpushare.io/gpu-usage", "{}")).get("gpus", {})
    out: dict[str, Any] = {"mem": 0, "core": 0, "containers": 0, **gpus.get(str(gpu), {})}
    return out


def pod_of_process(host_pid: int) -> str:
    """The Ray pod a process of the node belongs to: KubeRay puts the pod's name in RAY_CLOUD_INSTANCE_ID of its
    Ray container, and Ray's processes inherit it ('' for any other process)."""
    try:
        env = Path(f"/proc/{host_pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    for kv in env:
        if kv.startswith(b"RAY_CLOUD_INSTANCE_ID="):
            return kv.split(b"=", 1)[1].decode()
    return ""


def gpu_time_by_pod(cluster: Cluster, node: str, gpu: int = 0) -> dict[str, int]:
    """GPU time (ns) each Ray pod's processes have had on the node's fake GPU `gpu` (its kernel timeline)."""
    out: dict[str, int] = {}
    for t in cluster.node(node).driver.process_times(gpu):
        pod = pod_of_process(t.host_pid)
        if pod:
            out[pod] = out.get(pod, 0) + t.busy_ns
    return out


def shares(cluster: Cluster, node: str, seconds: float, gpu: int = 0) -> dict[str, float]:
    """Each Ray pod's share of the GPU (percent of its time) over the next `seconds`."""
    before, t0 = gpu_time_by_pod(cluster, node, gpu), time.monotonic()
    time.sleep(seconds)
    after, t1 = gpu_time_by_pod(cluster, node, gpu), time.monotonic()
    return {pod: 100.0 * (ns - before.get(pod, 0)) / ((t1 - t0) * 1e9) for pod, ns in after.items()}
