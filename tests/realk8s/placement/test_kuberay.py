"""KubeRay on shared GPUs (KubeRay's GPU guide on this project's shares, docs/guide/kuberay.md), on the test cluster
with its pods running for real: the real KubeRay operator (v1.5.0, `make e2e-bin`) with its shipped CRDs and RBAC,
Ray 2.60.0 from PyPI in the pods' image (`make ray-venv`), one node with one fake 16 GiB GPU in core_mem mode, so
that every worker shares it.

- a RayCluster as docs/guide/kuberay.md writes it reaches ready; a Ray job's GPU task on a worker sees the
  worker's slice in CuPy and nvidia-smi and stops at its cap with CuPy's own OutOfMemoryError; the head sees no GPU;
- the worker group scaled 0 -> 3 -> 1 places three shares on the GPU and frees two;
- with enableInTreeAutoscaling, a pending GPU task makes Ray's autoscaler add a worker on a share, and the idle
  worker is removed again; without `num-gpus` in the group's rayStartParams it adds none;
- two RayClusters of two namespaces share the GPU: each sees only its own slice and its own use of it, and each
  holds its own compute share while both are busy.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realk8s import kuberay
from tests.realk8s.cluster import Cluster, Spec, running
from tests.realk8s.rayclusters import GROUP, Workers, raycluster

pytestmark = pytest.mark.realk8s

GiB = 1 << 30
NODE = "gpu-node-0"
JOB = (Path(__file__).parents[1] / "workload" / "ray_gpu_job.py").read_text()
OOM = "cupy.cuda.memory.OutOfMemoryError"
CONTEXT_CHARGE = 256 << 20  # the shim charges each process's CUDA context to the slice (docs/reference/shim.md)
# The fake GPU's kernel timeline: each launch of the job's 1000-block kernel takes 1 ms of the GPU, and a process
# queues at most 20 ms ahead (a test knob of the fake driver, read by the worker's processes).
TIMELINE = (("FAKE_CUDA_NS_PER_BLOCK", "1000"), ("FAKE_CUDA_QUEUE_US", "20000"))


@pytest.fixture(scope="module")
def kr() -> Iterator[Cluster]:
    """A cluster of one node with one 16 GiB GPU, the KubeRay operator running against it."""
    missing = kuberay.missing()
    if missing:
        pytest.fail(f"the KubeRay tests need {', '.join(missing)}")
    with running(Spec(nodes=1, gpus=1, gpu_mib=16 * 1024)) as cluster:
        operator = kuberay.install(cluster)
        try:
            yield cluster
        finally:
            operator.stop()


@pytest.fixture
def rns(kr: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the KubeRay cluster; at the end its RayClusters are deleted, then its pods (no garbage
    collector runs: KubeRay's pods would outlive their RayCluster), and nothing of them may be left on the node."""
    failed = request.session.testsfailed
    name = kr.namespace("ray")
    yield name
    if request.session.testsfailed > failed:
        print(kr.logs(80))
    for rc in kuberay.custom(kr).list_namespaced_custom_object(kuberay.GROUP, kuberay.API_VERSION, name,
                                                               kuberay.PLURAL)["items"]:
        kuberay.delete(kr, name, rc["metadata"]["name"])
    time.sleep(1)  # the operator sees the deletion before the pods go, and creates no more
    kr.clear_namespace(name, timeout=120)


def ready(cluster: Cluster, ns: str, name: str, workers: int, timeout: float = 240) -> None:
    """Until the RayCluster is `ready` with its head and `workers` worker pods Running, and the readiness probes
    KubeRay gave their Ray containers pass."""
    def done() -> bool:
        rc = kuberay.get(cluster, ns, name)
        ps = [p for p in kuberay.pods(cluster, ns, name) if kuberay.running(p)]
        return (rc.get("status", {}).get("state") == "ready"
                and len([p for p in ps if (p.metadata.labels or {}).get("ray.io/group") == GROUP]) == workers
                and all(kuberay.probes_pass(cluster, p) for p in ps))
    kuberay.wait(f"RayCluster {ns}/{name} ready with {workers} workers", done, timeout,
                 lambda: kuberay.describe(cluster, ns, name))


def gpu_holds(cluster: Cluster, containers: int, timeout: float = 60) -> dict:
    """Until the node daemon's usage of the GPU counts `containers` containers; that usage (mem, core)."""
    def usage() -> dict | None:
        u: dict = kuberay.gpu_usage(cluster, NODE)
        return u if u["containers"] == containers else None
    out: dict = kuberay.wait(f"{containers} containers on the GPU", usage, timeout,
                             lambda: str(kuberay.gpu_usage(cluster, NODE)))
    return out


def worker_pods(cluster: Cluster, ns: str, name: str) -> list[str]:
    return sorted(p.metadata.name for p in kuberay.pods(cluster, ns, name, GROUP))


def job(cluster: Cluster, ns: str, name: str, *args: str) -> tuple[float, list[dict]]:
    """Submit the GPU job; the Ray cluster's GPU count and each task's report."""
    out = kuberay.submit(cluster, ns, name, JOB, list(args))
    [gpus] = kuberay.results(out, "CLUSTER ")
    return float(gpus["GPU"]), kuberay.results(out)


def assert_sees_its_slice(report: dict, mem_gib: int) -> None:
    """A GPU task saw the worker's slice and stopped at its cap with CuPy's own error."""
    assert report["cuda_visible_devices"] == "0", report
    assert report["total"] == mem_gib * GiB, report  # cudaMemGetInfo's total is the slice
    assert report["error"] and report["error"]["type"] == OOM, report
    assert report["free"] == mem_gib * GiB - CONTEXT_CHARGE, report  # its own context's charge, nothing else
    assert report["held"] == mem_gib * GiB - CONTEXT_CHARGE, report  # 256 MiB blocks up to the cap, not past it
    [[_, total_mib, _]] = report["smi"]
    assert int(total_mib) == mem_gib * 1024, report  # nvidia-smi in the task: the slice


def test_a_raycluster_as_the_docs_write_it_runs_gpu_tasks_on_its_workers_slices(kr: Cluster, rns: str) -> None:
    kuberay.create(kr, rns, raycluster("shared-gpu", Workers(mem=4, core=30, replicas=1)))
    ready(kr, rns, "shared-gpu", workers=1)
    [worker] = kuberay.pods(kr, rns, "shared-gpu", GROUP)
    record = json.loads(worker.metadata.annotations["gpushare.io/allocated"])
    [share] = record["containers"]["ray-worker"]
    assert (share["mem"], share["core"]) == (4, 30)

    gpus, [report] = job(kr, rns, "shared-gpu")
    assert gpus == 1.0  # the worker's num-gpus: Ray counts one GPU for the slice
    assert report["pod"] == worker.metadata.name
    assert_sees_its_slice(report, 4)

    # the head asks for no GPU and sees none: no device node, no driver
    head = kuberay.head_pod(kr, rns, "shared-gpu")
    out = kr.exec(rns, head, "ray-head", ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES; ls /dev | grep -c '^nvidia'"])
    assert out["stdout"].split() == ["void", "0"], out
    assert kr.audit() == []


def test_scaling_the_worker_group_places_and_frees_shares(kr: Cluster, rns: str) -> None:
    kuberay.create(kr, rns, raycluster("scaled", Workers(mem=4, core=30, replicas=0)))
    ready(kr, rns, "scaled", workers=0)
    assert kuberay.gpu_usage(kr, NODE)["containers"] == 0

    kuberay.set_replicas(kr, rns, "scaled", GROUP, 3)
    ready(kr, rns, "scaled", workers=3)
    usage = gpu_holds(kr, 3)
    assert (usage["mem"], usage["core"]) == (12, 90)
    three = worker_pods(kr, rns, "scaled")
    gpus, reports = job(kr, rns, "scaled", "--tasks", "3", "--gpus", "3")
    assert gpus == 3.0
    assert sorted(r["pod"] for r in reports) == three  # one task on each worker, each on its own slice
    for report in reports:
        assert_sees_its_slice(report, 4)
    assert kr.audit() == []

    kuberay.set_replicas(kr, rns, "scaled", GROUP, 1)
    kuberay.wait("two workers gone", lambda: len(worker_pods(kr, rns, "scaled")) == 1, 120,
                 lambda: kuberay.describe(kr, rns, "scaled"))
    usage = gpu_holds(kr, 1)
    assert (usage["mem"], usage["core"]) == (4, 30)
    assert kr.audit() == []


def test_the_autoscaler_adds_a_worker_on_a_share_for_a_pending_gpu_task_and_removes_it_when_idle(
        kr: Cluster, rns: str) -> None:
    kuberay.create(kr, rns, raycluster("auto", Workers(mem=4, core=30, replicas=0), autoscaling=True,
                                       idle_timeout_s=20))
    ready(kr, rns, "auto", workers=0)
    head = kuberay.head_pod(kr, rns, "auto")
    containers = kr.core.read_namespaced_pod(head, rns).spec.containers
    assert [c.name for c in containers] == ["ray-head", "autoscaler"]
    # KubeRay's sidecar sets no NVIDIA_VISIBLE_DEVICES; the mutating webhook voided it (it asks for no GPU)
    assert {e.name: e.value for e in containers[1].env or []}.get("NVIDIA_VISIBLE_DEVICES") == "void"

    # the task asks for a GPU no node has: the autoscaler (with the head pod's service account) adds a worker
    t0 = time.monotonic()
    gpus, [report] = job(kr, rns, "auto")
    scaled_up_s = time.monotonic() - t0
    [worker] = worker_pods(kr, rns, "auto")
    assert report["pod"] == worker
    [wait_gcs] = kr.core.read_namespaced_pod(worker, rns).spec.init_containers  # KubeRay's, voided as well
    assert {e.name: e.value for e in wait_gcs.env or []}.get("NVIDIA_VISIBLE_DEVICES") == "void"
    assert_sees_its_slice(report, 4)
    assert kuberay.get(kr, rns, "auto")["spec"]["workerGroupSpecs"][0]["replicas"] == 1
    print(f"job with scale-up: {scaled_up_s:.1f} s")

    # idle for the timeout: the autoscaler removes it and its share is freed
    kuberay.wait("the idle worker removed", lambda: not worker_pods(kr, rns, "auto"), 180,
                 lambda: kuberay.describe(kr, rns, "auto"))
    group = kuberay.get(kr, rns, "auto")["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 0 and group["scaleStrategy"]["workersToDelete"] == [worker]
    gpu_holds(kr, 0)


def test_without_num_gpus_the_autoscaler_adds_no_worker_for_a_gpu_task(kr: Cluster, rns: str) -> None:
    """docs/guide/kuberay.md's second point: KubeRay reads a group's GPUs from `num-gpus` or from a limit whose
    name ends in `gpu`; without either, Ray's autoscaler does not know the group has GPUs and a GPU task stays
    pending."""
    kuberay.create(kr, rns, raycluster("no-num-gpus", Workers(replicas=0, num_gpus=None), autoscaling=True,
                                       idle_timeout_s=20))
    ready(kr, rns, "no-num-gpus", workers=0)
    job_id = kuberay.start_job(kr, rns, "no-num-gpus", JOB)
    kuberay.wait("the GPU task among Ray's pending demands", lambda: "'GPU': 1.0" in kuberay.pending_demands(
        kr, rns, "no-num-gpus"), 120, lambda: kuberay.pending_demands(kr, rns, "no-num-gpus"), period=3)
    deadline = time.monotonic() + 30  # six periods of the autoscaler
    while time.monotonic() < deadline:
        assert worker_pods(kr, rns, "no-num-gpus") == [], kuberay.describe(kr, rns, "no-num-gpus")
        assert kuberay.get(kr, rns, "no-num-gpus")["spec"]["workerGroupSpecs"][0]["replicas"] == 0
        time.sleep(2)
    assert kuberay.job_status(kr, rns, "no-num-gpus", job_id) in ("PENDING", "RUNNING")
    assert "'GPU': 1.0" in kuberay.pending_demands(kr, rns, "no-num-gpus")


def test_two_rayclusters_of_two_namespaces_share_one_gpu_without_seeing_each_other(kr: Cluster, rns: str) -> None:
    other = kr.namespace("ray")
    try:
        teams = {rns: Workers(mem=6, core=30, env=TIMELINE), other: Workers(mem=4, core=70, env=TIMELINE)}
        for ns, workers in teams.items():
            kuberay.create(kr, ns, raycluster("ray", workers))
        for ns in teams:
            ready(kr, ns, "ray", workers=1)
        uuids = {ns: json.loads(kuberay.pods(kr, ns, "ray", GROUP)[0].metadata.annotations[
            "gpushare.io/allocated"])["containers"]["ray-worker"][0]["uuid"] for ns in teams}
        assert len(set(uuids.values())) == 1  # one GPU

        reports: dict[str, list[dict]] = {}
        errors: list[BaseException] = []

        def run(ns: str, spin_s: int) -> None:
            try:
                reports[ns] = job(kr, ns, "ray", "--spin", str(spin_s))[1]
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
                errors.append(exc)

        pods = {ns: worker_pods(kr, ns, "ray")[0] for ns in teams}
        # the first team's task holds its whole slice and keeps the GPU busy before the second one starts, and until
        # well after (a job takes a few seconds to reach the GPU on a loaded machine)
        first = threading.Thread(target=run, args=(rns, 40))
        first.start()
        kuberay.wait("the first team's task on the GPU", lambda: kuberay.gpu_time_by_pod(kr, NODE).get(pods[rns]),
                     120, lambda: str(kuberay.gpu_time_by_pod(kr, NODE)), period=0.2)
        second = threading.Thread(target=run, args=(other, 15))
        second.start()
        kuberay.wait("both teams' tasks on the GPU", lambda: kuberay.gpu_time_by_pod(kr, NODE).get(pods[other]),
                     120, lambda: str(kuberay.gpu_time_by_pod(kr, NODE)), period=0.2)
        time.sleep(1.5)
        got = kuberay.shares(kr, NODE, 3.0)
        assert set(pods.values()) <= set(got), f"not both on the GPU for the whole window: {got}"
        first.join(180)
        second.join(180)
        assert not errors, errors

        # memory: each sees its own slice, all of it free while the other team holds its own, and fills it
        for ns, workers in teams.items():
            [report] = reports[ns]
            assert report["pod"] == pods[ns]
            assert_sees_its_slice(report, workers.mem)
            [[uuid, _, used_mib]] = report["smi"]
            assert uuid == uuids[ns] and int(used_mib) == workers.mem * 1024, report  # its own use, all of it
        # compute: while both were busy, each held its own share (30 % and 70 %: the GPU full)
        print(f"shares while both busy: {got}")
        for ns, workers in teams.items():
            assert abs(got[pods[ns]] - workers.core) <= 5, got
    finally:
        for rc in kuberay.custom(kr).list_namespaced_custom_object(kuberay.GROUP, kuberay.API_VERSION, other,
                                                                   kuberay.PLURAL)["items"]:
            kuberay.delete(kr, other, rc["metadata"]["name"])
        time.sleep(1)
        kr.clear_namespace(other, timeout=120)
