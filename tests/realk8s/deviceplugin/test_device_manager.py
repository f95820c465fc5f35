"""Against the kubelet's REAL device manager (e2e/bin/nodeagent --standalone, Kubernetes 1.36.3): first the
kubelet's own stub plugin (the device manager's books, admission, freeing, restart from its checkpoint), then the
project's node daemon (`devplugin serve`, no apiserver, on the fake driver) registering its three resources."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplugin import contract as c
from devplugin.allocation.units import decode_id
from devplugin.api.podresources.v1 import api_pb2 as pr_pb2
from devplugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplugin_sim.fake_driver import FakeDriver, seed_node
from tests.realk8s.agent import NodeAgent, pod_manifest
from tests.realk8s.stub import StubPlugin
from tests.support.daemon_harness import CORE, COUNT, MEM, short_dir

pytestmark = pytest.mark.realk8s

DEV = "example.com/dev"


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(root: Path, request: pytest.FixtureRequest) -> Iterator[NodeAgent]:
    node = NodeAgent(root / "node").start()
    try:
        yield node
    finally:
        node.stop()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(f"--- node agent log ---\n{node.log_text()}")


def pod_of(books: dict[str, Any], uid: str) -> dict[str, Any] | None:
    return next((p for p in books["pods"] if p["uid"] == uid), None)


def devices_of(books: dict[str, Any], uid: str, container: str) -> dict[str, list[str]]:
    pod = pod_of(books, uid)
    assert pod is not None, f"pod {uid} is not in the books: {books}"
    return next(ctr["devices"] for ctr in pod["containers"] if ctr["name"] == container)


# --- the kubelet's own stub plugin ---


def test_stub_plugin_capacity_admission_freeing_and_restart(agent: NodeAgent, root: Path) -> None:
    with StubPlugin(agent.plugin_dir, DEV, 4):
        books = agent.wait_books(lambda b: b["capacity"].get(DEV) == 4)
        assert books["allocatable"][DEV] == 4
        assert books["healthy"][DEV] == ["dev-0", "dev-1", "dev-2", "dev-3"]

        assert agent.admit(pod_manifest("two", "uid-two", [{DEV: 2}]))["admitted"] is True
        two = devices_of(agent.books(), "uid-two", "c0")[DEV]
        assert len(two) == 2

        refused = agent.admit(pod_manifest("three", "uid-three", [{DEV: 3}]))
        assert refused["admitted"] is False and refused["reason"] == "UnexpectedAdmissionError"
        assert "Requested: 3, Available: 2" in refused["message"]
        assert pod_of(agent.books(), "uid-three")["phase"] == "Failed"  # type: ignore[index]

        agent.end("uid-two")
        assert pod_of(agent.books(), "uid-two") is None
        assert agent.admit(pod_manifest("three-again", "uid-three-again", [{DEV: 3}]))["admitted"] is True
        held = devices_of(agent.books(), "uid-three-again", "c0")[DEV]
        assert len(held) == 3

        agent.restart()
        books = agent.books()
        assert devices_of(books, "uid-three-again", "c0")[DEV] == held  # read back from the checkpoint
        # The stub registers again when the restarted kubelet's socket appears; then the last device is free.
        agent.wait_books(lambda b: b["capacity"].get(DEV) == 4, timeout=40)
        assert agent.admit(pod_manifest("one", "uid-one", [{DEV: 1}]))["admitted"] is True
        one = devices_of(agent.books(), "uid-one", "c0")[DEV]
        assert set(one).isdisjoint(held) and len(one) == 1
    assert agent.stop() == 0  # SIGTERM: a clean exit


def test_init_container_devices_go_to_the_app_container_and_sidecars_keep_theirs(agent: NodeAgent) -> None:
    with StubPlugin(agent.plugin_dir, DEV, 4):
        agent.wait_books(lambda b: b["capacity"].get(DEV) == 4)
        pod = pod_manifest("init", "uid-init", [{DEV: 2}], init_containers=[{DEV: 2}])
        assert agent.admit(pod)["admitted"] is True
        books = agent.books()
        assert devices_of(books, "uid-init", "c0")[DEV] == devices_of(books, "uid-init", "i0")[DEV]

        sidecar = pod_manifest("side", "uid-side", [{DEV: 1}], init_containers=[{DEV: 1}], sidecars=[0])
        assert agent.admit(sidecar)["admitted"] is True
        books = agent.books()
        side, app = devices_of(books, "uid-side", "i0")[DEV], devices_of(books, "uid-side", "c0")[DEV]
        assert len(side) == len(app) == 1 and side != app


def test_predicate_admit_handler_refuses_what_the_node_cannot_fit(agent: NodeAgent) -> None:
    pod = pod_manifest("big", "uid-big", [{}])
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100"}, "limits": {"cpu": "100"}}
    res = agent.admit(pod)
    assert res.pop("seconds") >= 0
    assert res == {"admitted": False, "reason": "OutOfcpu",
                   "message": "Node didn't have enough resource: cpu, requested: 100000, used: 0, capacity: 64000"}


def test_bad_flags_exit_2_saying_what_to_change(root: Path) -> None:
    node = NodeAgent(root / "n")
    proc = subprocess.run([*node.command()[:3], "--root", str(root)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "exactly one of --kubeconfig FILE" in proc.stderr
    proc = subprocess.run([node.command()[0], "--root", str(root), "--standalone"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "--node-name is required" in proc.stderr


def test_pod_resources_lists_active_pods_only(agent: NodeAgent) -> None:
    """The kubelet's PodResources server as the daemon reads it: List gives the active pods (1.36's default
    KubeletPodResourcesListUseActivePods) with each container's devices; a rejected pod and an ended one are not
    listed, and Get does not find the rejected one."""
    with StubPlugin(agent.plugin_dir, DEV, 2):
        agent.wait_books(lambda b: b["capacity"].get(DEV) == 2)
        assert agent.admit(pod_manifest("held", "uid-held", [{DEV: 2}]))["admitted"] is True
        assert agent.admit(pod_manifest("refused", "uid-refused", [{DEV: 1}]))["admitted"] is False
        assert agent.admit(pod_manifest("ending", "uid-ending", [{}]))["admitted"] is True
        agent.end("uid-ending")
        with grpc.insecure_channel(f"unix://{agent.pod_resources_socket}") as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)
            listed = stub.List(pr_pb2.ListPodResourcesRequest(), timeout=10)
            got = {p.name: {c.name: sorted(i for d in c.devices for i in d.device_ids) for c in p.containers}
                   for p in listed.pod_resources}
            assert got == {"held": {"c0": devices_of(agent.books(), "uid-held", "c0")[DEV]}}
            with pytest.raises(grpc.RpcError, match="pod refused in namespace default not found"):
                stub.Get(pr_pb2.GetPodResourcesRequest(pod_name="refused", pod_namespace="default"), timeout=10)
            allocatable = stub.GetAllocatableResources(pr_pb2.AllocatableResourcesRequest(), timeout=10)
            assert sorted(i for d in allocatable.devices for i in d.device_ids) == ["dev-0", "dev-1"]


# --- the project's node daemon against the real device manager ---


@pytest.fixture
def daemon(agent: NodeAgent, root: Path) -> Iterator[subprocess.Popen[str]]:
    driver = FakeDriver.create(root / "drv", seed_node(4, 15360))
    env = {**os.environ, **driver.env()}
    log = open(root / "daemon.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "devplugin", "serve", "--plugin-dir", str(agent.plugin_dir),
         "--pod-resources-socket", str(agent.pod_resources_socket), "--mode", "core_mem", "--node-name", "",
         "--shim", "off", "--state-dir", str(root / "state"), "--health-port", "0"],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        agent.wait_books(lambda b: b["capacity"].get(COUNT) == 4 and b["capacity"].get(MEM) == 60
                         and b["capacity"].get(CORE) == 400)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        log.close()
        print(f"--- daemon log ---\n{(root / 'daemon.log').read_text(errors='replace')}")


def gpu_of(ids: list[str]) -> set[str]:
    return {decode_id(i)[0] for i in ids}


def test_daemon_registers_and_a_shared_pod_gets_envs_matching_its_devices(
        agent: NodeAgent, daemon: subprocess.Popen[str]) -> None:
    res = agent.admit(pod_manifest("shared", "uid-shared", [{MEM: 3, CORE: 30}]))
    assert res["admitted"] is True, res
    ctr = pod_of(agent.books(), "uid-shared")["containers"][0]  # type: ignore[index]
    mem, core = ctr["devices"][MEM], ctr["devices"][CORE]
    assert len(mem) == 3 and len(core) == 30
    (uuid,) = gpu_of(mem) | gpu_of(core)  # one GPU for the whole container
    envs = ctr["envs"]
    assert envs[c.ENV_NVIDIA_VISIBLE_DEVICES] == uuid
    assert envs[c.ENV_ALIYUN_MEM_CONTAINER] == "3"
    assert envs[c.ENV_SM_LIMIT] == "30"


def test_daemon_whole_gpu_pod(agent: NodeAgent, daemon: subprocess.Popen[str]) -> None:
    res = agent.admit(pod_manifest("whole", "uid-whole", [{COUNT: 1}]))
    assert res["admitted"] is True, res
    ctr = pod_of(agent.books(), "uid-whole")["containers"][0]  # type: ignore[index]
    (dev,) = ctr["devices"][COUNT]
    assert ctr["envs"][c.ENV_NVIDIA_VISIBLE_DEVICES] == decode_id(dev)[0]


def test_daemon_init_container_hands_its_devices_to_the_app_container(
        agent: NodeAgent, daemon: subprocess.Popen[str]) -> None:
    """Issue 14 defect 4: the kubelet calls Allocate for the app container with the init container's very IDs."""
    pod = pod_manifest("handoff", "uid-handoff", [{MEM: 2, CORE: 20}], init_containers=[{MEM: 2, CORE: 20}])
    res = agent.admit(pod)
    assert res["admitted"] is True, res
    books = agent.books()
    assert devices_of(books, "uid-handoff", "c0") == devices_of(books, "uid-handoff", "i0")
