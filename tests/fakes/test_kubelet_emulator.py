"""The kubelet emulator against a tiny fake device plugin, over real unix sockets.

Socket paths must stay under 108 bytes, so the fixtures use short directories made with
tempfile.mkdtemp(dir="/tmp") rather than pytest's tmp_path.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devplugin.api.podresources.v1 import api_pb2 as pr_pb2
from devplugin.api.podresources.v1 import api_pb2_grpc as pr_grpc
from devplugin_sim.kubelet import (
    AdmissionError,
    ContainerSpec,
    KubeletEmulator,
    Mount,
    PluginOptions,
    PodSpec,
)

GPU_MEM = "aliyun.com/gpu-mem"
GPU_CORE = "aliyun.com/gpu-core.percentage"


class FakePlugin(api_pb2_grpc.DevicePluginServicer):
    """A minimal device plugin: fixed devices, scripted GetPreferredAllocation / Allocate answers."""

    def __init__(self, plugin_dir: Path, resource: str, ids: list[str], *, endpoint: str | None = None,
                 gpa: bool = False, pre_start: bool = False) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.endpoint = endpoint or resource.replace("/", "_") + ".sock"
        self.options = api_pb2.DevicePluginOptions(get_preferred_allocation_available=gpa,
                                                   pre_start_required=pre_start)
        self.devices = {i: "Healthy" for i in ids}
        self.prefer = None  # callable(available, size) -> ids, or a grpc.StatusCode to fail with
        self.allocate_answer = None  # callable(ids) -> ContainerAllocateResponse, a StatusCode, or "empty"
        self.gpa_requests: list[tuple[list[str], int]] = []
        self.allocate_requests: list[list[str]] = []
        self.pre_start_requests: list[list[str]] = []
        self.streams_ended = 0
        self._cond = threading.Condition()
        self._version = 0
        self._server: grpc.Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.endpoint

    def serve(self) -> FakePlugin:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix:{self.socket_path}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None

    def register(self, *, version: str = "v1beta1",
                 options: api_pb2.DevicePluginOptions | None = None) -> None:
        with grpc.insecure_channel(f"unix:{self.plugin_dir / 'kubelet.sock'}") as ch:
            api_pb2_grpc.RegistrationStub(ch).Register(api_pb2.RegisterRequest(
                version=version, endpoint=self.endpoint, resource_name=self.resource,
                options=options or self.options), timeout=10)

    def set_health(self, **health: str) -> None:
        with self._cond:
            self.devices.update(health)
            self._version += 1
            self._cond.notify_all()

    def set_devices(self, ids: list[str]) -> None:
        with self._cond:
            self.devices = {i: "Healthy" for i in ids}
            self._version += 1
            self._cond.notify_all()

    # --- DevicePlugin service -------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request, context):
        return self.options

    def ListAndWatch(self, request, context):
        done = threading.Event()

        def ended() -> None:
            done.set()
            with self._cond:
                self._cond.notify_all()

        context.add_callback(ended)
        seen = -1
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda last=seen: done.is_set() or self._version != last)
                    if done.is_set():
                        return
                    seen = self._version
                    devs = [api_pb2.Device(ID=i, health=h) for i, h in self.devices.items()]
                yield api_pb2.ListAndWatchResponse(devices=devs)
        finally:
            self.streams_ended += 1

    def GetPreferredAllocation(self, request, context):
        r = request.container_requests[0]
        self.gpa_requests.append((list(r.available_deviceIDs), r.allocation_size))
        if isinstance(self.prefer, grpc.StatusCode):
            context.abort(self.prefer, "no GPU has room")
        ids = self.prefer(list(r.available_deviceIDs), r.allocation_size) if self.prefer else []
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids)])

    def Allocate(self, request, context):
        ids = list(request.container_requests[0].devices_ids)
        self.allocate_requests.append(ids)
        if isinstance(self.allocate_answer, grpc.StatusCode):
            context.abort(self.allocate_answer, "IDs span two GPUs")
        if self.allocate_answer == "empty":
            return api_pb2.AllocateResponse()
        if self.allocate_answer is not None:
            return api_pb2.AllocateResponse(container_responses=[self.allocate_answer(ids)])
        return api_pb2.AllocateResponse(container_responses=[api_pb2.ContainerAllocateResponse(
            envs={f"{self.resource.split('/')[1].upper()}_IDS": ",".join(sorted(ids))})])

    def PreStartContainer(self, request, context):
        self.pre_start_requests.append(list(request.devices_ids))
        return api_pb2.PreStartContainerResponse()


@pytest.fixture
def sockdir():
    d = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def plugin_dir(sockdir):
    d = sockdir / "dp"
    d.mkdir()
    return d


@pytest.fixture
def kubelet(plugin_dir):
    with KubeletEmulator(plugin_dir, seed=7, grace_period_s=300.0) as k:
        yield k


@pytest.fixture
def plugins():
    started: list[FakePlugin] = []
    yield started
    for p in started:
        p.stop()


def connect(kubelet: KubeletEmulator, plugins: list, resource: str, n: int, **kw) -> FakePlugin:
    p = FakePlugin(kubelet.plugin_dir, resource, [f"{resource[-3:]}-{i}" for i in range(n)], **kw).serve()
    plugins.append(p)
    p.register()
    assert kubelet.wait_for(lambda k: k.capacity().get(resource) == n)
    return p


def pod(name: str, **limits: int) -> PodSpec:
    names = {"mem": GPU_MEM, "core": GPU_CORE}
    return PodSpec(name, [ContainerSpec("main", {names.get(k, k): v for k, v in limits.items()})])


def is_socket(path: Path) -> bool:
    return path.exists() and stat.S_ISSOCK(os.stat(path).st_mode)


# --- registration ------------------------------------------------------------------------------------------

def test_register_keeps_the_options_the_plugin_answers(kubelet, plugins):
    p = FakePlugin(kubelet.plugin_dir, GPU_MEM, ["m-0", "m-1"], gpa=True).serve()
    plugins.append(p)
    p.register(options=api_pb2.DevicePluginOptions(pre_start_required=True))
    assert kubelet.registrations() == 1
    assert kubelet.registered() == {GPU_MEM: PluginOptions(pre_start_required=False,
                                                           get_preferred_allocation_available=True)}
    assert kubelet.wait_for(lambda k: k.allocatable() == {GPU_MEM: 2})


def test_register_fails_at_once_when_the_plugin_does_not_serve(plugin_dir):
    with KubeletEmulator(plugin_dir, dial_timeout_s=0.3) as k:
        p = FakePlugin(plugin_dir, GPU_MEM, ["m-0"])  # never served
        with pytest.raises(grpc.RpcError) as err:
            p.register()
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert "failed to dial device plugin" in err.value.details()
        assert str(p.socket_path) in err.value.details()
        assert k.registrations() == 0 and k.registered() == {} and k.capacity() == {}


@pytest.mark.parametrize("version,resource,text", [
    ("v1alpha", GPU_MEM, 'requested API version "v1alpha" is not supported by kubelet'),
    ("v1beta1", "gpu-mem", 'the ResourceName "gpu-mem" is invalid'),
    ("v1beta1", "kubernetes.io/gpu", 'the ResourceName "kubernetes.io/gpu" is invalid'),
])
def test_register_refuses_bad_version_and_resource_name(kubelet, plugins, version, resource, text):
    p = FakePlugin(kubelet.plugin_dir, resource, ["x-0"], endpoint="p.sock").serve()
    plugins.append(p)
    with pytest.raises(grpc.RpcError) as err:
        p.register(version=version)
    assert text in err.value.details()
    assert kubelet.registrations() == 0


def test_second_registration_replaces_the_first_endpoint(kubelet, plugins):
    old = connect(kubelet, plugins, GPU_MEM, 2)
    new = FakePlugin(kubelet.plugin_dir, GPU_MEM, ["new-0", "new-1", "new-2"], endpoint="new.sock").serve()
    plugins.append(new)
    new.register()
    assert kubelet.registrations() == 2
    assert kubelet.wait_for(lambda k: set(k.devices(GPU_MEM)) == {"new-0", "new-1", "new-2"})
    assert kubelet.wait_for(lambda k: old.streams_ended == 1)
    old.stop()  # the replaced plugin going away does not touch the resource
    assert kubelet.allocatable() == {GPU_MEM: 3} and GPU_MEM in kubelet.registered()


# --- ListAndWatch ------------------------------------------------------------------------------------------

def test_capacity_and_allocatable_follow_list_and_watch(kubelet, plugins):
    p = connect(kubelet, plugins, GPU_MEM, 4)
    p.set_health(**{"mem-1": "Unhealthy"})
    assert kubelet.wait_for(lambda k: k.allocatable() == {GPU_MEM: 3})
    assert kubelet.capacity() == {GPU_MEM: 4}
    assert kubelet.devices(GPU_MEM)["mem-1"] == "Unhealthy"
    p.set_devices(["mem-0", "mem-2"])  # each message replaces the whole set
    assert kubelet.wait_for(lambda k: k.capacity() == {GPU_MEM: 2})
    assert kubelet.devices(GPU_MEM) == {"mem-0": "Healthy", "mem-2": "Healthy"}


def test_stream_break_turns_devices_unhealthy_then_drops_the_resource(plugin_dir, plugins):
    with KubeletEmulator(plugin_dir, grace_period_s=1.0) as k:
        p = connect(k, plugins, GPU_MEM, 3)
        p.stop()
        assert k.wait_for(lambda k: k.allocatable() == {GPU_MEM: 0})
        assert k.capacity() == {GPU_MEM: 3}
        assert set(k.devices(GPU_MEM).values()) == {"Unhealthy"}
        assert k.registered() == {}
        assert k.wait_for(lambda k: GPU_MEM not in k.capacity(), timeout=5)


def test_registering_again_within_the_grace_period_keeps_the_resource(plugin_dir, plugins):
    with KubeletEmulator(plugin_dir, grace_period_s=1.0) as k:
        p = connect(k, plugins, GPU_MEM, 2)
        p.stop()
        assert k.wait_for(lambda k: k.allocatable() == {GPU_MEM: 0})
        p.serve().register()
        assert k.wait_for(lambda k: k.allocatable() == {GPU_MEM: 2})
        assert not k.wait_for(lambda k: GPU_MEM not in k.capacity(), timeout=1.3)


def test_list_and_watch_message_over_4_mib_breaks_the_stream(kubelet, plugins):
    p = connect(kubelet, plugins, GPU_MEM, 2)
    p.set_devices([f"{i:06d}-" + "x" * 56 for i in range(70000)])  # about 4.6 MB in one message
    assert kubelet.wait_for(lambda k: k.registered() == {})
    assert kubelet.capacity() == {GPU_MEM: 2} and kubelet.allocatable() == {GPU_MEM: 0}


# --- admission ---------------------------------------------------------------------------------------------

def test_resources_are_allocated_in_random_order(kubelet, plugins):
    connect(kubelet, plugins, GPU_MEM, 2)
    connect(kubelet, plugins, GPU_CORE, 2)
    orders = set()
    for i in range(30):
        result = kubelet.admit(pod(f"p{i}", mem=1, core=1))
        orders.add(tuple(c.split()[1] for c in result.containers[0].calls))
        kubelet.remove_pod(result.pod.uid)
    assert orders == {(GPU_MEM, GPU_CORE), (GPU_CORE, GPU_MEM)}


def test_preferred_allocation_is_used_and_filled_when_short(kubelet, plugins):
    p = connect(kubelet, plugins, GPU_MEM, 6, gpa=True)
    p.prefer = lambda available, size: ["mem-4", "ghost-9"]  # one usable ID, one never advertised
    result = kubelet.admit(pod("a", mem=3)).containers[0]
    assert result.calls == [f"GetPreferredAllocation {GPU_MEM}", f"Allocate {GPU_MEM}"]
    ids = result.device_ids[GPU_MEM]
    assert len(ids) == 3 and len(set(ids)) == 3 and "mem-4" in ids and "ghost-9" not in ids
    assert p.allocate_requests == [ids]
    assert p.gpa_requests[0][1] == 3 and sorted(p.gpa_requests[0][0]) == [f"mem-{i}" for i in range(6)]
    assert result.unknown_ids == {GPU_MEM: ["ghost-9"]}
    assert kubelet.unknown_ids() == [(GPU_MEM, "ghost-9")]
    # the next pod is offered only what is left
    p.prefer = lambda available, size: available[:size]
    second = kubelet.admit(pod("b", mem=3)).containers[0].device_ids[GPU_MEM]
    assert sorted(p.gpa_requests[1][0]) == sorted(set(f"mem-{i}" for i in range(6)) - set(ids))
    assert set(second).isdisjoint(ids)


def test_plugin_without_preferred_allocation_is_not_asked(kubelet, plugins):
    p = connect(kubelet, plugins, GPU_MEM, 3)
    result = kubelet.admit(pod("a", mem=2)).containers[0]
    assert result.calls == [f"Allocate {GPU_MEM}"] and p.gpa_requests == []


def test_too_few_devices_is_refused_and_the_pod_keeps_nothing(kubelet, plugins):
    connect(kubelet, plugins, GPU_MEM, 4)
    kubelet.admit(pod("holder", mem=2))
    greedy = PodSpec("greedy", [ContainerSpec("a", {GPU_MEM: 1}), ContainerSpec("b", {GPU_MEM: 5})])
    with pytest.raises(AdmissionError) as err:
        kubelet.admit(greedy)
    assert "requested number of devices unavailable for aliyun.com/gpu-mem. Requested: 5, Available: 1" \
        in str(err.value)
    assert err.value.reason == "UnexpectedAdmissionError"
    assert greedy.uid not in kubelet.allocations()  # container a's device was given back
    kubelet.admit(pod("rest", mem=2))


@pytest.mark.parametrize("failing", ["GetPreferredAllocation", "Allocate", "empty"])
def test_plugin_errors_fail_admission_and_roll_back(kubelet, plugins, failing):
    connect(kubelet, plugins, GPU_CORE, 2)
    p = connect(kubelet, plugins, GPU_MEM, 2, gpa=True)
    if failing == "GetPreferredAllocation":
        p.prefer, text = grpc.StatusCode.RESOURCE_EXHAUSTED, \
            "device plugin GetPreferredAllocation rpc failed with err: rpc error: code = ResourceExhausted " \
            "desc = no GPU has room"
    elif failing == "Allocate":
        p.allocate_answer, text = grpc.StatusCode.INVALID_ARGUMENT, \
            "rpc error: code = InvalidArgument desc = IDs span two GPUs"
    else:
        p.allocate_answer, text = "empty", "no containers return in allocation response"
    spec = pod("x", mem=1, core=1)
    with pytest.raises(AdmissionError) as err:
        kubelet.admit(spec)
    assert text in str(err.value) and str(err.value).startswith("Allocate failed due to ")
    assert kubelet.allocations() == {}
    assert kubelet.admit(pod("y", core=2)).containers[0].device_ids[GPU_CORE]


def test_extended_resource_nobody_serves_is_refused(kubelet, plugins):
    connect(kubelet, plugins, GPU_MEM, 2)
    with pytest.raises(AdmissionError) as err:
        kubelet.admit(pod("x", mem=1, **{"example.com/fpga": 1, "cpu": 2}))
    assert err.value.reason == "OutOfexample.com/fpga"
    assert kubelet.allocations() == {}
    assert list(kubelet.admit(pod("y", mem=1, cpu=2)).containers[0].device_ids) == [GPU_MEM]


def test_envs_merge_first_key_wins_and_conflicts_are_reported(kubelet, plugins):
    mem = connect(kubelet, plugins, GPU_MEM, 2)
    core = connect(kubelet, plugins, GPU_CORE, 2)
    mem.allocate_answer = lambda ids: api_pb2.ContainerAllocateResponse(
        envs={"SHARED": "0", "DIFFERS": "from-mem", "LD_PRELOAD": "/x.so"},
        mounts=[api_pb2.Mount(container_path="/etc/x", host_path="/h/mem", read_only=True)])
    core.allocate_answer = lambda ids: api_pb2.ContainerAllocateResponse(
        envs={"SHARED": "0", "DIFFERS": "from-core"},
        mounts=[api_pb2.Mount(container_path="/etc/x", host_path="/h/core", read_only=True)])
    winners = set()
    for i in range(12):
        spec = PodSpec(f"p{i}", [ContainerSpec("c", {GPU_MEM: 1, GPU_CORE: 1}, env={"LD_PRELOAD": ""})])
        c = kubelet.admit(spec).containers[0]
        assert c.envs["SHARED"] == "0" and c.envs["LD_PRELOAD"] == ""  # the spec's own env overrides
        assert len(c.conflicts) == 2 and any("DIFFERS" in x for x in c.conflicts)
        assert len(c.mounts) == 1
        assert c.mounts[0] in (Mount("/etc/x", "/h/mem", True), Mount("/etc/x", "/h/core", True))
        winners.add(c.envs["DIFFERS"])
        kubelet.remove_pod(spec.uid)
    assert winners == {"from-mem", "from-core"}  # which resource wins is up to map order


def test_pre_start_container_only_where_the_plugin_asks(kubelet, plugins):
    mem = connect(kubelet, plugins, GPU_MEM, 2, pre_start=True)
    core = connect(kubelet, plugins, GPU_CORE, 2)
    c = kubelet.admit(pod("a", mem=1, core=1)).containers[0]
    assert f"PreStartContainer {GPU_MEM}" in c.calls and f"PreStartContainer {GPU_CORE}" not in c.calls
    assert c.calls.index(f"PreStartContainer {GPU_MEM}") > c.calls.index(f"Allocate {GPU_MEM}")
    assert mem.pre_start_requests == [c.device_ids[GPU_MEM]] and core.pre_start_requests == []


# --- restart and PodResources ------------------------------------------------------------------------------

def test_restart_wipes_sockets_keeps_files_and_allocations(kubelet, plugins):
    p = connect(kubelet, plugins, GPU_MEM, 4)
    held = kubelet.admit(pod("a", mem=3))
    notes = kubelet.plugin_dir / "notes.txt"
    notes.write_text("stay")
    stray = socket.socket(socket.AF_UNIX)
    stray.bind(str(kubelet.plugin_dir / "stray.sock"))
    stray.close()
    kubelet.restart()
    assert not p.socket_path.exists() and not (kubelet.plugin_dir / "stray.sock").exists()
    assert is_socket(kubelet.socket_path) and notes.read_text() == "stay"
    assert kubelet.checkpoint_path.is_file()
    assert kubelet.capacity() == {GPU_MEM: 0} and kubelet.registered() == {}
    assert kubelet.allocations()[held.pod.uid] == {"main": {GPU_MEM: held.containers[0].device_ids[GPU_MEM]}}
    p.stop()
    p.serve().register()
    assert kubelet.wait_for(lambda k: k.allocatable() == {GPU_MEM: 4})
    assert kubelet.registrations() == 2
    with pytest.raises(AdmissionError, match="Requested: 2, Available: 1"):
        kubelet.admit(pod("b", mem=2))


def test_allocations_come_back_from_the_checkpoint_file_only(kubelet, plugins):
    connect(kubelet, plugins, GPU_MEM, 2)
    kept = kubelet.admit(pod("a", mem=1))
    kubelet.stop()
    kubelet.start()
    assert kubelet.allocations() == {kept.pod.uid: {"main": kept.containers[0].device_ids}}
    kubelet.stop()
    kubelet.checkpoint_path.unlink()
    kubelet.start()
    assert kubelet.allocations() == {}


def test_pod_resources_lists_allocations_and_allocatable_devices(kubelet, plugins):
    p = connect(kubelet, plugins, GPU_MEM, 3)
    p.set_health(**{"mem-2": "Unhealthy"})
    assert kubelet.wait_for(lambda k: k.allocatable() == {GPU_MEM: 2})
    spec = PodSpec("web", [ContainerSpec("app", {GPU_MEM: 1}), ContainerSpec("side", {"cpu": 1})],
                   namespace="ns")
    got = kubelet.admit(spec).container("app").device_ids[GPU_MEM]
    with grpc.insecure_channel(f"unix:{kubelet.pod_resources_socket}") as ch:
        stub = pr_grpc.PodResourcesListerStub(ch)
        listed = stub.List(pr_pb2.ListPodResourcesRequest(), timeout=5).pod_resources
        assert [(x.name, x.namespace) for x in listed] == [("web", "ns")]
        app, side = listed[0].containers
        assert (app.name, side.name) == ("app", "side") and list(side.devices) == []
        assert [(d.resource_name, list(d.device_ids)) for d in app.devices] == [(GPU_MEM, got)]
        alloc = stub.GetAllocatableResources(pr_pb2.AllocatableResourcesRequest(), timeout=5).devices
        assert sorted(i for d in alloc for i in d.device_ids) == ["mem-0", "mem-1"]
        one = stub.Get(pr_pb2.GetPodResourcesRequest(pod_name="web", pod_namespace="ns"), timeout=5)
        assert list(one.pod_resources.containers[0].devices[0].device_ids) == got
        with pytest.raises(grpc.RpcError, match="pod nope in namespace ns not found"):
            stub.Get(pr_pb2.GetPodResourcesRequest(pod_name="nope", pod_namespace="ns"), timeout=5)
    kubelet.remove_pod(spec.uid)
    assert kubelet.allocations() == {}


def test_specs_reject_bad_input():
    with pytest.raises(ValueError, match="whole number"):
        ContainerSpec("c", {GPU_MEM: -1})
    with pytest.raises(ValueError, match="no containers"):
        PodSpec("p", [])
    with pytest.raises(ValueError, match="repeat"):
        PodSpec("p", [ContainerSpec("c", {}), ContainerSpec("c", {})])
    with pytest.raises(ValueError, match="108|107-byte"):
        KubeletEmulator(Path("/tmp/" + "x" * 120))
