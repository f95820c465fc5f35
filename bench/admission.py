"""Container admission latency over the real sockets: GetPreferredAllocation + Allocate for gpu-mem and
gpu-core.percentage, as the kubelet calls them, on an 8-GPU node (8 x 80 GiB). Prints p50 / p99.

Run: .venv/bin/python bench/admission.py [--admissions 2000]
Targets: p50 <= 1 ms, p99 <= 3 ms.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import CORE, MEM, gpus, percentile, start_daemon, stop, workdir  # noqa: E402
from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc  # noqa: E402
from devplugin.daemon import socket_name  # noqa: E402
from devplugin.sim.fake_driver import FakeDriver  # noqa: E402
from devplugin.sim.kubelet import KubeletEmulator  # noqa: E402
from devplugin.units import Kind  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--admissions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    root = workdir()
    rng = random.Random(args.seed)
    try:
        driver = FakeDriver.create(root / "drv", gpus(8, 80 * 1024))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            daemon = start_daemon(driver, root)
            if not kubelet.wait_for(lambda k: k.allocatable().get(CORE, 0) == 800, timeout=30):
                print("daemon did not register", file=sys.stderr)
                return 1
            all_ids = {MEM: sorted(kubelet.devices(MEM)), CORE: sorted(kubelet.devices(CORE))}
            stubs = {
                res: api_pb2_grpc.DevicePluginStub(
                    grpc.insecure_channel(f"unix://{root / 'dp' / socket_name('aliyun.com', kind)}")
                )
                for res, kind in ((MEM, Kind.MEM), (CORE, Kind.CORE))
            }
            held: dict[str, set[str]] = {MEM: set(), CORE: set()}
            live: list[dict[str, list[str]]] = []
            times: list[float] = []
            refused = 0
            for i in range(args.admissions + 50):
                if len(live) > 24 or (live and rng.random() < 0.5):
                    for res, ids in live.pop(rng.randrange(len(live))).items():
                        held[res].difference_update(ids)
                request = {MEM: rng.randint(1, 8), CORE: rng.choice(range(5, 35, 5))}
                order = [MEM, CORE]
                rng.shuffle(order)
                got: dict[str, list[str]] = {}
                avail = {res: [d for d in all_ids[res] if d not in held[res]] for res in order}
                t0 = time.perf_counter()
                try:
                    for res in order:
                        available = avail[res]
                        pref = stubs[res].GetPreferredAllocation(
                            api_pb2.PreferredAllocationRequest(
                                container_requests=[
                                    api_pb2.ContainerPreferredAllocationRequest(
                                        available_deviceIDs=available, allocation_size=request[res]
                                    )
                                ]
                            )
                        )
                        ids = list(pref.container_responses[0].deviceIDs)
                        stubs[res].Allocate(
                            api_pb2.AllocateRequest(
                                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                            )
                        )
                        got[res] = ids
                        held[res].update(ids)
                except grpc.RpcError:
                    refused += 1
                    for res, ids in got.items():
                        held[res].difference_update(ids)
                    continue
                elapsed = time.perf_counter() - t0
                live.append(got)
                if i >= 50:  # warm-up
                    times.append(elapsed)
            stop(daemon)
        ms = [t * 1000 for t in times]
        print(f"admissions: {len(ms)} (refused for lack of room: {refused}) on 8 x 80 GiB, core_mem, binpack")
        print(
            "admission latency (GPA + Allocate for gpu-mem and gpu-core.percentage, 4 RPCs, client-measured): "
            f"p50 {percentile(ms, 50):.3f} ms, p99 {percentile(ms, 99):.3f} ms, max {max(ms):.3f} ms"
        )
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
