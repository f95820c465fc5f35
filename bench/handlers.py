"""The daemon's own work per container admission, without gRPC: Allocator.preferred + Allocator.allocate for
gpu-mem and gpu-core.percentage on an 8 x 80 GiB node, with the kubelet's `available` lists as protobuf
repeated fields (as the servicer receives them). Prints microseconds per call.

Run: .venv/bin/python bench/handlers.py [--admissions 3000]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devplugin.allocation.allocator import Allocator  # noqa: E402
from devplugin.allocation.node import Node  # noqa: E402
from devplugin.allocation.units import Kind, device_ids  # noqa: E402
from devplugin.api.deviceplugin.v1beta1 import api_pb2  # noqa: E402
from devplugin.gpu.inventory import GPU  # noqa: E402


def as_received(ids: list[str], size: int) -> api_pb2.ContainerPreferredAllocationRequest:
    msg = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=size)])
    return api_pb2.PreferredAllocationRequest.FromString(msg.SerializeToString()).container_requests[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--admissions", type=int, default=3000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    gpus = tuple(GPU(i, f"GPU-{i:08x}-bench-0000-0000-{i:012x}", "H100", 80 << 30, i, f"0000:{i:02x}:00.0", 0)
                 for i in range(8))
    node = Node(gpus=gpus)
    allocator = Allocator(node)
    requests = {kind: as_received([i for g in gpus for i in device_ids(g, kind, node.unit)], size)
                for kind, size in ((Kind.MEM, 4), (Kind.CORE, 20))}
    spent = {"GetPreferredAllocation": 0.0, "Allocate": 0.0}
    for n in range(args.admissions + 100):
        for kind, req in requests.items():  # the kubelet's view never fills up: every call sees the same lists
            t0 = time.perf_counter()
            ids = allocator.preferred(kind, req.available_deviceIDs, req.must_include_deviceIDs, req.allocation_size)
            t1 = time.perf_counter()
            allocator.allocate(kind, ids)
            t2 = time.perf_counter()
            if n >= 100:
                spent["GetPreferredAllocation"] += t1 - t0
                spent["Allocate"] += t2 - t1
    calls = 2 * args.admissions
    print(f"8 x 80 GiB, {len(requests[Kind.MEM].available_deviceIDs)} gpu-mem and "
          f"{len(requests[Kind.CORE].available_deviceIDs)} gpu-core IDs available; mean over {args.admissions} "
          "admissions:")
    for call, seconds in spent.items():
        print(f"  {call}: {seconds / calls * 1e6:.1f} us per call")
    print(f"  one admission (4 calls): {sum(spent.values()) / args.admissions * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
