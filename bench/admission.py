"""Container admission latency over the real sockets: GetPreferredAllocation + Allocate for gpu-mem and
gpu-core.percentage, as the kubelet calls them, on an 8-GPU node (8 x 80 GiB). Prints p50 / p99.

The client is either Python gRPC (whose own cost, ~0.3 ms per RPC, dominates the figure) or the compiled
gRPC C++ client in bench/cpp (closer to the kubelet, a compiled Go client). Both draw the same containers
from the same seed; with --client both they run one after the other against the same daemon (the second
starts on a daemon that remembers the first's recent requests, so its refused count can differ a little).

With --pods N (110, the kubelet's default pod limit, when N is left out) it measures admission with pod lookup
against node-local pairing in one run (bench/pod_lookup.py): the daemon linked to the fake apiserver, N pods
bound to the node, each admitted container's pod added just before its admission and seen by the daemon's pod
cache; then the same workload on a daemon without an apiserver.

Run: .venv/bin/python bench/admission.py [--admissions 2000] [--client python|cpp|both]
     .venv/bin/python bench/admission.py --pods [--admissions 1000] [--client python|cpp|both]
Targets: p50 <= 1 ms, p99 <= 3 ms (with pod lookup too, C++ client).
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import CORE, MEM, REPO, gpus, percentile, start_daemon, stop, workdir  # noqa: E402
from bench.pod_lookup import measure, report  # noqa: E402
from devplugin.allocation.units import Kind  # noqa: E402
from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc  # noqa: E402
from devplugin.deviceplugin.daemon import socket_name  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver  # noqa: E402
from devplugin_sim.kubelet import KubeletEmulator  # noqa: E402

WARMUP = 50
CPP_DIR = REPO / "bench" / "cpp"
CPP_CLIENT = REPO / "build" / "bench" / "admission_client"
APT_PACKAGES = "libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev pkg-config"


@dataclass
class Result:
    client: str
    admissions: int
    refused: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    detail: str = ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admissions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--client", choices=("python", "cpp", "both"), default=None,
                        help="which gRPC client measures (default: cpp if bench/cpp builds, else python)")
    parser.add_argument("--pods", type=int, nargs="?", const=110, default=0, metavar="N",
                        help="pod lookup against node-local pairing, N pods bound to the node (default 110)")
    parser.add_argument("--settle-ms", type=float, default=15.0,
                        help="with --pods: pause before each admission, for the pod cache to see the new pod")
    args = parser.parse_args()
    if args.admissions < 1 or args.pods < 0 or args.settle_ms < 0:
        parser.error("--admissions must be at least 1, --pods and --settle-ms not negative")
    clients = choose_clients(args.client)
    if not clients:
        return 1
    if args.pods:
        return run_pod_lookup(clients, args)
    root = workdir()
    try:
        driver = FakeDriver.create(root / "drv", gpus(8, 80 * 1024))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            daemon = start_daemon(driver, root)
            try:
                if not kubelet.wait_for(lambda k: k.allocatable().get(CORE, 0) == 800, timeout=30):
                    print("daemon did not register", file=sys.stderr)
                    return 1
                # The client drives the plugin sockets itself, outside the emulator's books: the kubelet's
                # PodResources would list none of its containers and the daemon would forget them. Take it away once
                # registered; the daemon then keeps its view from the calls' available IDs, as it must with a
                # kubelet that cannot answer.
                (root / "pr.sock").unlink(missing_ok=True)
                sockets = {res: root / "dp" / socket_name("aliyun.com", kind)
                           for res, kind in ((MEM, Kind.MEM), (CORE, Kind.CORE))}
                results = []
                for client in clients:
                    if client == "python":
                        all_ids = {MEM: sorted(kubelet.devices(MEM)), CORE: sorted(kubelet.devices(CORE))}
                        results.append(run_python(sockets, all_ids, args.admissions, args.seed))
                    else:
                        results.append(run_cpp(sockets, args.admissions, args.seed))
            finally:
                stop(daemon)
        for r in results:
            print(f"{r.client} client: admissions: {r.admissions} (refused for lack of room: {r.refused}) "
                  "on 8 x 80 GiB, core_mem, binpack")
            print(f"{r.client} client: admission latency (GPA + Allocate for gpu-mem and gpu-core.percentage, "
                  f"4 RPCs, client-measured): p50 {r.p50_ms:.3f} ms, p99 {r.p99_ms:.3f} ms, max {r.max_ms:.3f} ms")
            if r.detail:
                print(f"{r.client} client: per call {r.detail}")
        return 0
    except RuntimeError as exc:
        print(f"admission bench: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_pod_lookup(clients: list[str], args: argparse.Namespace) -> int:
    try:
        for client in clients:
            report(measure(client, CPP_CLIENT, args.admissions, WARMUP, args.seed, args.settle_ms / 1000,
                           args.pods))
    except RuntimeError as exc:
        print(f"admission bench: {exc}", file=sys.stderr)
        return 1
    return 0


def choose_clients(wanted: str | None) -> list[str]:
    """The clients to run, in order; builds the C++ client when it is wanted. Empty when it cannot be had."""
    if wanted == "python":
        return ["python"]
    why = build_cpp()
    if why is None:
        return ["python", "cpp"] if wanted == "both" else ["cpp"]
    if wanted is None:
        print(f"note: measuring with the Python client, whose own cost dominates the figure ({why})",
              file=sys.stderr)
        return ["python"]
    print(f"admission bench: the C++ client is not available: {why}", file=sys.stderr)
    return []


def build_cpp() -> str | None:
    """Build build/bench/admission_client (a no-op when up to date); None on success, else why not."""
    try:
        proc = subprocess.run(["make", "-s", "-C", str(CPP_DIR), f"BUILD={CPP_CLIENT.parent}"],
                              capture_output=True, text=True)
    except FileNotFoundError:
        proc = None
    if proc is not None and proc.returncode == 0 and CPP_CLIENT.exists():
        return None
    if proc is None:
        detail = "make not found"
    else:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("make")]
        detail = lines[0] if lines else f"make exited {proc.returncode}"
    if CPP_CLIENT.exists():
        print(f"note: rebuilding {CPP_CLIENT} failed ({detail}); using the existing binary", file=sys.stderr)
        return None
    hint = "" if "apt-get" in detail else f"; the build needs: apt-get install -y {APT_PACKAGES}"
    return f"building {CPP_CLIENT} failed: {detail}{hint}"


def run_cpp(sockets: dict[str, Path], admissions: int, seed: int) -> Result:
    """Run the C++ client against the daemon's sockets and parse its one-line key=value summary."""
    cmd = [str(CPP_CLIENT), "--mem-socket", str(sockets[MEM]), "--core-socket", str(sockets[CORE]),
           "--seed", str(seed), "--admissions", str(admissions), "--warmup", str(WARMUP)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{CPP_CLIENT.name} exited {proc.returncode}: {proc.stderr.strip()}")
    line = proc.stdout.strip().splitlines()[-1]
    fields = dict(kv.split("=", 1) for kv in line.split())
    try:
        detail = (f"p50: GetPreferredAllocation {float(fields['gpa_p50_ms']):.3f} ms, "
                  f"Allocate {float(fields['allocate_p50_ms']):.3f} ms, "
                  f"empty RPC (GetDevicePluginOptions) {float(fields['empty_rpc_p50_ms']):.3f} ms")
        return Result("cpp", int(fields["admissions"]), int(fields["refused"]), float(fields["p50_ms"]),
                      float(fields["p99_ms"]), float(fields["max_ms"]), detail)
    except (KeyError, ValueError) as exc:
        raise RuntimeError(f"cannot read {CPP_CLIENT.name} output {line!r}: {exc}") from exc


def run_python(sockets: dict[str, Path], all_ids: dict[str, list[str]], admissions: int, seed: int) -> Result:
    """Admit containers with the Python gRPC client, one channel per socket."""
    rng = random.Random(seed)
    stubs = {res: api_pb2_grpc.DevicePluginStub(grpc.insecure_channel(f"unix://{path}"))
             for res, path in sockets.items()}
    held: dict[str, set[str]] = {MEM: set(), CORE: set()}
    live: list[dict[str, list[str]]] = []
    times: list[float] = []
    refused = 0
    for i in range(admissions + WARMUP):
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
        if i >= WARMUP:
            times.append(elapsed)
    ms = [t * 1000 for t in times]
    return Result("python", len(ms), refused, percentile(ms, 50), percentile(ms, 99), max(ms))


if __name__ == "__main__":
    sys.exit(main())
