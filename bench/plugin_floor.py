"""The floor of a Python device plugin's admission cost through the kubelet's REAL device manager
(e2e/bin/nodeagent --standalone): the kubelet's own stub plugin (Go) against minimal Python plugins that do no work
(GetPreferredAllocation answers the first IDs offered, Allocate one env), served by grpc's thread-pool server
("sync") or its asyncio server ("aio"), without and with GetPreferredAllocation ("pref": four calls per
two-resource container, as `devplugin serve` makes, instead of two). Each variant on its own node agent with two
resources of 640 and 800 devices, admissions interleaved as in bench/real_admission.py (gpu-mem-like 1 to 40,
core-like 5 to 60, at most --live pods on a node). The time is the agent's admit handlers'. Needs `make e2e-bin`.

Run: .venv/bin/python bench/plugin_floor.py [--pods 300] [--variants go sync aio syncpref aiopref] [--seed 7]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from bench.common import percentile, workdir  # noqa: E402
from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc  # noqa: E402
from tests.realk8s.agent import NodeAgent, pod_manifest  # noqa: E402
from tests.realk8s.stub import StubPlugin  # noqa: E402

MEM, CORE = "example.com/mem", "example.com/core"
SIZES = {MEM: (640, "mem.sock"), CORE: (800, "core.sock")}


class Minimal(api_pb2_grpc.DevicePluginServicer):
    """A plugin that does nothing but answer."""

    def __init__(self, devices: int, preferred: bool) -> None:
        self.options = api_pb2.DevicePluginOptions(get_preferred_allocation_available=preferred)
        self.devices = api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=f"dev-{i}", health="Healthy") for i in range(devices)])

    def GetDevicePluginOptions(self, request, context):  # type: ignore[no-untyped-def] # noqa: N802
        return self.options

    def ListAndWatch(self, request, context) -> Iterator[api_pb2.ListAndWatchResponse]:  # type: ignore[no-untyped-def] # noqa: N802
        yield self.devices
        threading.Event().wait()

    def GetPreferredAllocation(self, request, context):  # type: ignore[no-untyped-def] # noqa: N802
        resp = api_pb2.PreferredAllocationResponse()
        for req in request.container_requests:
            resp.container_responses.add(deviceIDs=list(req.available_deviceIDs)[:req.allocation_size])
        return resp

    def Allocate(self, request, context):  # type: ignore[no-untyped-def] # noqa: N802
        resp = api_pb2.AllocateResponse()
        for req in request.container_requests:
            resp.container_responses.add(envs={"STUB_DEVICES": ",".join(req.devices_ids)})
        return resp


class MinimalAio(Minimal):
    async def GetDevicePluginOptions(self, request, context):  # type: ignore[no-untyped-def] # noqa: N802
        return self.options

    async def ListAndWatch(self, request, context):  # type: ignore[no-untyped-def,override] # noqa: N802
        yield self.devices
        await asyncio.Event().wait()

    async def GetPreferredAllocation(self, request, context):  # type: ignore[no-untyped-def] # noqa: N802
        return Minimal.GetPreferredAllocation(self, request, context)

    async def Allocate(self, request, context):  # type: ignore[no-untyped-def] # noqa: N802
        return Minimal.Allocate(self, request, context)


def register(plugin_dir: str, socket: str, resource: str, preferred: bool) -> None:
    with grpc.insecure_channel(f"unix://{plugin_dir}/kubelet.sock") as channel:
        api_pb2_grpc.RegistrationStub(channel).Register(api_pb2.RegisterRequest(
            version="v1beta1", endpoint=socket, resource_name=resource,
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=preferred)), timeout=10,
            wait_for_ready=True)
    print("registered", flush=True)


def serve(plugin_dir: str, resource: str, aio: bool, preferred: bool) -> None:
    """One minimal plugin until killed (the child process of a Python variant)."""
    devices, socket = SIZES[resource]
    address = f"unix://{plugin_dir}/{socket}"
    if aio:
        async def main() -> None:
            server = grpc.aio.server()
            api_pb2_grpc.add_DevicePluginServicer_to_server(MinimalAio(devices, preferred), server)
            server.add_insecure_port(address)
            await server.start()
            await asyncio.get_running_loop().run_in_executor(None, register, plugin_dir, socket, resource,
                                                             preferred)
            await server.wait_for_termination()
        asyncio.run(main())
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    api_pb2_grpc.add_DevicePluginServicer_to_server(Minimal(devices, preferred), server)
    server.add_insecure_port(address)
    server.start()
    register(plugin_dir, socket, resource, preferred)
    server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=300)
    ap.add_argument("--live", type=int, default=12)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--variants", nargs="+", default=["go", "sync", "aio", "syncpref", "aiopref"],
                    choices=["go", "sync", "aio", "syncpref", "aiopref"])
    ap.add_argument("--serve", nargs=4, metavar=("PLUGIN_DIR", "RESOURCE", "SERVER", "PREFERRED"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        plugin_dir, resource, server, preferred = args.serve
        serve(plugin_dir, resource, server == "aio", preferred == "pref")
        return
    variants = ["go", *[v for v in args.variants if v != "go"]]  # ratios are to the Go stub
    root = workdir()
    agents: dict[str, NodeAgent] = {}
    children: list[subprocess.Popen[str]] = []
    stubs: list[StubPlugin] = []
    try:
        for v in variants:
            agent = agents[v] = NodeAgent(root / v, f"{v}-node").start()
            for resource, (devices, socket) in SIZES.items():
                if v == "go":
                    stubs.append(StubPlugin(agent.plugin_dir, resource, devices, socket_name=socket).start())
                    continue
                child = subprocess.Popen(
                    [sys.executable, __file__, "--serve", str(agent.plugin_dir), resource,
                     "aio" if v.startswith("aio") else "sync", "pref" if v.endswith("pref") else "plain"],
                    stdout=subprocess.PIPE, text=True)
                children.append(child)
                assert child.stdout is not None and child.stdout.readline().startswith("registered"), v
            agent.wait_books(lambda b: b["allocatable"].get(MEM) == 640 and b["allocatable"].get(CORE) == 800)
        rng = random.Random(args.seed)
        times: dict[str, list[float]] = {v: [] for v in variants}
        held: list[int] = []
        for i in range(args.pods):
            if len(held) >= args.live:
                gone = held.pop(rng.randrange(len(held)))
                for v, agent in agents.items():
                    agent.end(f"{v}-{gone}")
            limits = {MEM: rng.randint(1, 40), CORE: 5 * rng.randint(1, 12)}
            for v, agent in agents.items():
                res = agent.admit(pod_manifest(f"p-{i}", f"{v}-{i}", [limits]))
                assert res["admitted"], f"{v}: pod {i} refused: {res}"
                times[v].append(res["seconds"] * 1000)
            held.append(i)
        print(f"admission through the kubelet's device manager (admit handlers' time), {args.pods} pods, "
              "interleaved; ratios to the kubelet's stub plugin (go)")
        g50, g99 = percentile(times["go"], 50), percentile(times["go"], 99)
        for v in variants:
            p50, p99 = percentile(times[v], 50), percentile(times[v], 99)
            print(f"{v:9s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms   ratio p50 {p50 / g50:4.2f}x  p99 {p99 / g99:4.2f}x")
    finally:
        for s in stubs:
            s.stop()
        for child in children:
            child.terminate()
            child.wait(10)
        for agent in agents.values():
            agent.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
