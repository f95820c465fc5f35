"""NodePrepareResources latency of `devplugin dra` through its real gRPC socket, as the kubelet's DRA manager calls
it: one claim, and a pod with 4 claims (one call, as the kubelet prepares a pod's claims of one driver together).

Each claim is read from a real kube-apiserver (e2e/bin, `make e2e-bin`) with its allocation as kube-scheduler
writes it (a share of one of 8 GPUs, consumedCapacity and shareID) and reserved for a pod bound to the node, whose
containers the plugin checks (one container, one claim). The plugin writes the shim's limits and accounting files
and a CDI spec (on tmpfs, as /var/run is on a node), then its checkpoint (on disk, fsync). Between two prepares the
claims are unprepared (also timed), so every prepare does the whole work. With --reader memory the claims come
from memory instead: the plugin's own cost.

Two plugins run side by side, their calls taken in turn: one reads the pods a claim is reserved for from its watch
of the pods bound to its node (devplugin/dra/pods.py, as `devplugin dra` does), the other with a GET per pod (as
before that watch). Each row says how many pod GETs its plugin made.

Run: .venv/bin/python bench/dra_prepare.py [--rounds 300] [--reader apiserver|memory]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import percentile  # noqa: E402
from devplugin import contract  # noqa: E402
from devplugin.api.dra.v1 import api_pb2 as dra_pb2  # noqa: E402
from devplugin.api.dra.v1 import api_pb2_grpc as dra_grpc  # noqa: E402
from devplugin.dra.conflicts import ConflictCheck  # noqa: E402
from devplugin.dra.plugin import DraPlugin  # noqa: E402
from devplugin.dra.pods import PodsOnNode  # noqa: E402
from devplugin.dra.prepare import Preparer  # noqa: E402
from devplugin.dra.slices import devices_by_name  # noqa: E402
from devplugin.gpu.device import GPU  # noqa: E402
from devplugin.isolation.shim_files import ShimPaths  # noqa: E402

NODE = "bench-node"
NS = "default"
GiB = 1 << 30
GPUS = [GPU(i, f"GPU-{i:08d}-5555-4000-8000-000000000000", "NVIDIA H100 80GB HBM3", 80 * GiB, i,
            f"00000000:{0x10 + i:02X}:00.0", 0) for i in range(8)]
POD_CLAIMS = 4


def claim_object(name: str, gpu: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": contract.DRA_DRIVER,
                "capacity": {"requests": {"memory": "4Gi", "cores": "10"}}}}]}}}


def allocation(gpu: int, pod: str, pod_uid: str) -> dict[str, Any]:
    return {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": contract.DRA_DRIVER, "pool": NODE, "device": f"gpu-{gpu}",
        "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "4Gi", "cores": "10"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}]}


def pod_object(name: str, claims: list[str]) -> dict[str, Any]:
    refs = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": NODE, "resourceClaims": refs, "containers": [
                {"name": f"main{i}", "image": "busybox", "resources": {"claims": [{"name": r["name"]}]}}
                for i, r in enumerate(refs)]}}


class MemoryStore:
    def __init__(self) -> None:
        self.objs: dict[tuple[str, str, str], dict[str, Any]] = {}

    def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["metadata"]["uid"] = str(uuid.uuid4())
        self.objs[(kind, NS, obj["metadata"]["name"])] = obj
        return obj

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        self.objs[("claim", NS, name)]["status"] = status

    def read_claim(self, ns: str, name: str) -> object:
        return copy.deepcopy(self.objs[("claim", ns, name)])

    def read_pod(self, ns: str, name: str) -> object:
        return copy.deepcopy(self.objs[("pod", ns, name)])

    def watched_pods(self) -> Any:
        """What the plugin's watch of its node's pods answers: here, the pods in memory."""
        def get(ns: str, name: str, uid: str) -> dict | None:
            pod = self.objs.get(("pod", ns, name))
            return pod if pod is not None and pod["metadata"]["uid"] == uid else None
        return get

    def close(self) -> None:
        pass


class ApiStore:
    """Claims and pods in the real kube-apiserver, read as `devplugin dra` reads them."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(str(kubeconfig), client_configuration=cfg)
        self.api = client.ApiClient(cfg)
        self.resource: Any = client.ResourceV1Api(self.api)
        self.core: Any = client.CoreV1Api(self.api)
        self.core.create_namespaced_service_account(NS, {"metadata": {"name": "default"},
                                                         "automountServiceAccountToken": False})

    def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        if kind == "claim":
            resp = self.resource.create_namespaced_resource_claim(NS, obj, _preload_content=False)
        else:
            resp = self.core.create_namespaced_pod(NS, obj, _preload_content=False)
        return dict(json.loads(resp.data))

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        claim = json.loads(self.resource.read_namespaced_resource_claim(name, NS, _preload_content=False).data)
        claim["status"] = status
        self.resource.replace_namespaced_resource_claim_status(name, NS, claim, _preload_content=False)

    def read_claim(self, ns: str, name: str) -> object:
        return json.loads(self.resource.read_namespaced_resource_claim(name, ns, _preload_content=False,
                                                                       _request_timeout=10).data)

    def read_pod(self, ns: str, name: str) -> object:
        return json.loads(self.core.read_namespaced_pod(name, ns, _preload_content=False, _request_timeout=10).data)

    def watched_pods(self) -> Any:
        """The plugin's watch of the pods bound to its node, as `devplugin dra` runs it."""
        self.pods = PodsOnNode(self.api, NODE).start()
        return self.pods.get

    def close(self) -> None:
        if hasattr(self, "pods"):
            self.pods.stop()


@contextmanager
def store_for(reader: str, root: Path) -> Iterator[Any]:
    if reader == "memory":
        yield MemoryStore()
        return
    from tests.realk8s.apiserver import bare_apiserver

    (root / "k8s").mkdir()
    with bare_apiserver(root / "k8s", "bench-token") as api:
        yield ApiStore(api.kubeconfig)


def make_pod(store: Any, name: str, n: int, first_gpu: int) -> list[dra_pb2.Claim]:
    names = [f"{name}-c{i}" for i in range(n)]
    claims = [store.create("claim", claim_object(c, (first_gpu + i) % len(GPUS))) for i, c in enumerate(names)]
    pod_uid = store.create("pod", pod_object(name, names))["metadata"]["uid"]
    for i, c in enumerate(names):
        store.set_status(c, allocation((first_gpu + i) % len(GPUS), name, pod_uid))
    return [dra_pb2.Claim(namespace=NS, name=c["metadata"]["name"], uid=c["metadata"]["uid"]) for c in claims]


def measure(stubs: list[dra_grpc.DRAPluginStub], pods: list[list[dra_pb2.Claim]], rounds: int
            ) -> list[tuple[list[float], list[float]]]:
    """Each round: every plugin prepares then unprepares the round's pod, in turn. (prepare ms, unprepare ms) per
    plugin."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in stubs]
    for r in range(rounds):
        claims = pods[r % len(pods)]
        for i in (range(len(stubs)) if r % 2 else reversed(range(len(stubs)))):  # who goes first alternates
            stub, (prep, unprep) = stubs[i], out[i]
            t0 = time.perf_counter()
            answer = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=claims), timeout=30)
            t1 = time.perf_counter()
            errors = [c.error for c in answer.claims.values() if c.error]
            if errors or len(answer.claims) != len(claims):
                raise SystemExit(f"prepare failed: {errors}")
            stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=30)
            t2 = time.perf_counter()
            prep.append((t1 - t0) * 1000)
            unprep.append((t2 - t1) * 1000)
    return out


def line(what: str, values: list[float]) -> str:
    return f"{what:<40} p50 {percentile(values, 50):7.2f} ms   p99 {percentile(values, 99):7.2f} ms   (n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--reader", choices=("apiserver", "memory"), default="apiserver")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    # As on a node: the CDI specs and the shim's files on tmpfs (/var/run), the checkpoint on disk (/var/lib).
    run = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"))
    try:
        with store_for(args.reader, root) as store:
            singles = [make_pod(store, f"one-{i}", 1, i) for i in range(8)]
            fours = [make_pod(store, f"four-{i}", POD_CLAIMS, i) for i in range(8)]
            dra = {contract.LABEL_ALLOCATION: contract.ALLOCATION_DRA}
            plugins, checks = [], []
            try:
                for name, cached in (("watch", store.watched_pods()), ("get", None)):
                    check = ConflictCheck(store.read_pod, cached)
                    preparer = Preparer(NODE, devices_by_name(GPUS), store.read_claim, run / name / "cdi",
                                        root / name / "plug" / "checkpoint.json",
                                        shim=ShimPaths(run / name / "shim", root / "libgpushare.so"), conflicts=check)
                    plugins.append(DraPlugin(NODE, preparer, None, root / name / "plug", root / name / "reg",
                                             labels=lambda: dra).start())
                    checks.append(check)
                time.sleep(1.0)  # the watch's first list
                with contextlib.ExitStack() as channels:
                    stubs = [dra_grpc.DRAPluginStub(channels.enter_context(grpc.insecure_channel(
                        f"unix://{root / name / 'plug' / 'dra.sock'}"))) for name in ("watch", "get")]
                    measure(stubs, singles, 20)  # warm up: connections, imports, page cache
                    reads = [c.reads for c in checks]
                    one = measure(stubs, singles, args.rounds)
                    four = measure(stubs, fours, args.rounds)
                    reads = [c.reads - r for c, r in zip(checks, reads, strict=True)]
            finally:
                for plugin in plugins:
                    plugin.stop()
                store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)
    print(f"devplugin dra, NodePrepareResources over the unix socket; claims read from: {args.reader}; "
          f"8 x 80 GiB GPUs; per claim shim files and CDI spec (tmpfs), one checkpoint per call (disk, fsync); "
          f"{args.rounds} rounds, the two plugins in turn")
    for i, how in enumerate(("pods from the plugin's watch", "a GET per pod (before)")):
        print(f"-- {how}: {reads[i]} pod GETs in {2 * args.rounds} prepares")
        print(line("NodePrepareResources, 1 claim", one[i][0]))
        print(line(f"NodePrepareResources, pod of {POD_CLAIMS} claims", four[i][0]))
        print(line("NodeUnprepareResources, 1 claim", one[i][1]))
        print(line(f"NodeUnprepareResources, pod of {POD_CLAIMS} claims", four[i][1]))
    p99 = [percentile(four[i][0], 99) for i in range(2)]
    print(f"pod of {POD_CLAIMS} claims, p99: {p99[0]:.2f} ms with the watch, {p99[1]:.2f} ms with a GET per pod "
          f"({p99[0] / p99[1]:.2f} x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
