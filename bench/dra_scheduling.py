"""Scheduling of GPU shares by the real kube-scheduler: DRA claims against device-plugin requests with the extender.

1. Throughput. The same seeded pods (one share each: 1, 2, 4 or 8 GiB and 5, 10 or 20 % of the cores) on the same
   nodes (--nodes x 8 GPUs x 80 GiB), created at once from 4 client threads:
   - DRA mode (tests/realk8s/dra_cluster.py: kube-scheduler's DynamicResources plugin, kube-controller-manager's
     resourceclaim controller, node agents with the kubelet's DRA manager, `devplugin dra`): each pod takes its
     share through a ResourceClaimTemplate; kube-scheduler as shipped (client QPS 50, burst 100), then restarted
     with `--kube-api-qps/--kube-api-burst` raised (--qps), then kube-controller-manager too (as shipped its client
     has QPS 20, burst 30, and its resourceclaim controller writes twice per pod: the claim, the pod's status),
     then kube-scheduler back to its shipped QPS with kube-controller-manager's raised (the scheduler's own cap);
   - device-plugin mode (tests/realk8s/cluster.py: kube-scheduler with the shipped configuration calling
     `devplugin scheduler`, node agents with the kubelet's device manager, `devplugin serve`): each pod asks
     aliyun.com/gpu-mem (GiB) and aliyun.com/gpu-core.percentage.
   Prints pods/s from the first create to the last pod bound and Running, and create->bound, create->Running
   p50 / p99 per pod.
2. Placement within a node (DRA): a seeded sequence of share claims, one pod at a time, pinned to one node of 8
   GPUs; prints how many GPUs hold a share and each GPU's shares, memory and cores, once with the node labelled
   ack.node.gpu.placement=binpack and once =spread (the node's `devplugin dra` restarted after each relabel);
   then the same sequence in device-plugin mode, where the extender reads that label.

Run: .venv/bin/python bench/dra_scheduling.py [--pods 100] [--nodes 2] [--qps 500] [--placement-claims 24]
     [--seed 1717] [--only all|dra|device-plugin|placement]
Needs e2e/bin (`make e2e-bin`) and build/shim (`make native`).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pod_burst import Burst, run_burst  # noqa: E402
from devplugin import contract  # noqa: E402
from tests.realk8s import podspecs  # noqa: E402
from tests.realk8s.cluster import Cluster, Spec, running  # noqa: E402
from tests.realk8s.dra_cluster import SHARE_CLASS, DraCluster, DraSpec, running_dra  # noqa: E402

GPUS, GPU_MIB = 8, 80 * 1024
MEM_GIB, CORES = (1, 2, 4, 8), (5, 10, 20)


def sizes(seed: int, n: int) -> list[tuple[int, int]]:
    """n seeded (GiB, cores %) shares."""
    rng = random.Random(seed)
    return [(rng.choice(MEM_GIB), rng.choice(CORES)) for _ in range(n)]


def template_name(gib: int, cores: int) -> str:
    return f"share-{gib}g-{cores}c"


def template(gib: int, cores: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": template_name(gib, cores)},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": SHARE_CLASS, "capacity": {"requests": {
                    contract.DRA_CAPACITY_MEMORY: f"{gib}Gi", contract.DRA_CAPACITY_CORES: str(cores)}}}}]}}}}


def dra_pod(name: str, gib: int, cores: int, node: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name(gib, cores)}],
        "containers": [{"name": "main", "image": podspecs.IMAGE, "resources": {"claims": [{"name": "gpu"}]}}]}}
    return podspecs.on_node(body, node) if node else body


def dra_namespace(cluster: DraCluster, mix: list[tuple[int, int]]) -> str:
    ns = cluster.namespace("bench")
    for gib, cores in sorted(set(mix)):
        cluster.create_resource("resourceclaimtemplates", template(gib, cores), ns)
    return ns


def admin_client(kubeconfig: Path, pool: int = 16) -> k8s.ApiClient:
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return k8s.ApiClient(cfg)


def dra_throughput(cluster: DraCluster, mix: list[tuple[int, int]], timeout: float, title: str) -> Burst:
    ns = dra_namespace(cluster, mix)
    api = admin_client(cluster.admin)
    res = run_burst(api, ns, [dra_pod(f"p{i:04d}", g, c) for i, (g, c) in enumerate(mix)], timeout)
    print(res.report(title, len(mix)), flush=True)
    cluster.clear_namespace(ns, timeout=240)
    api.close()
    return res


def placement(cluster: DraCluster, mix: list[tuple[int, int]], label: str) -> None:
    """The claims one at a time on the first node, each allocated before the next; then each GPU's shares."""
    node = cluster.nodes[0]
    cluster.core.patch_node(node.name, {"metadata": {"labels": {contract.LABEL_PLACEMENT: label}}})
    node.plugin.stop()
    node.plugin.start()
    cluster.wait_plugin(node)
    ns = dra_namespace(cluster, mix)
    for i, (gib, cores) in enumerate(mix):
        name = f"q{i:03d}"
        cluster.core.create_namespaced_pod(ns, dra_pod(name, gib, cores, node.name))
        cluster.wait(lambda n=name: cluster.core.read_namespaced_pod(n, ns).spec.node_name, f"{name} bound", 120)
    per_gpu: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for claim in cluster.resource("resourceclaims", ns):
        pod = next(r["name"] for r in claim["status"]["reservedFor"])
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]  # gpu-N
        per_gpu[int(device.split("-")[1])].append(mix[int(pod[1:])])
    print_gpus(per_gpu, f"DRA mode, kube-scheduler, {node.name} with {contract.LABEL_PLACEMENT}={label}")
    cluster.clear_namespace(ns, timeout=240)


def device_plugin_throughput(nodes: int, mix: list[tuple[int, int]], timeout: float,
                             seq: list[tuple[int, int]]) -> Burst:
    with running(Spec(nodes=nodes, gpus=GPUS, gpu_mib=GPU_MIB)) as cluster:
        print(f"device-plugin cluster up in {cluster.took:.1f} s: {nodes} nodes x {GPUS} GPUs x 80 GiB", flush=True)
        ns = cluster.namespace("bench")
        api = cluster.new_client(16)
        bodies = [podspecs.pod(f"p{i:04d}", [podspecs.Ask(mem=g, core=c)]) for i, (g, c) in enumerate(mix)]
        res = run_burst(api, ns, bodies, timeout)
        print(res.report("device-plugin mode, kube-scheduler + extender (shipped config)", len(mix)), flush=True)
        api.close()
        cluster.clear_namespace(ns, timeout=240)
        for label in ("binpack", "spread") if seq else ():
            dp_placement(cluster, seq, label)
        return res


def print_gpus(per_gpu: dict[int, list[tuple[int, int]]], where: str) -> None:
    print(f"{where}: {len(per_gpu)} of {GPUS} GPUs hold shares")
    for gpu in sorted(per_gpu):
        shares = per_gpu[gpu]
        print(f"  gpu-{gpu}: {len(shares):2d} shares, {sum(g for g, _ in shares):3d} GiB, "
              f"{sum(c for _, c in shares):3d} % cores")


def dp_placement(cluster: Cluster, mix: list[tuple[int, int]], label: str) -> None:
    """The same sequence in device-plugin mode: the extender reads the node's placement label."""
    node = cluster.nodes[0].name
    cluster.label_node(node, {contract.LABEL_PLACEMENT: label})
    time.sleep(2)  # the extender's node informer sees the label
    ns = cluster.namespace("place")
    per_gpu: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i, (gib, cores) in enumerate(mix):
        name = f"q{i:03d}"
        body = podspecs.on_node(podspecs.pod(name, [podspecs.Ask(mem=gib, core=cores)]), node)
        cluster.core.create_namespaced_pod(ns, body)
        deadline = time.monotonic() + 120
        while True:
            ann = cluster.core.read_namespaced_pod(name, ns).metadata.annotations or {}
            if contract.ANN_ALIYUN_MEM_IDX in ann:
                per_gpu[int(ann[contract.ANN_ALIYUN_MEM_IDX])].append((gib, cores))
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not bound by the extender within 120 s")
            time.sleep(0.1)
    print_gpus(per_gpu, f"device-plugin mode, extender, {node} with {contract.LABEL_PLACEMENT}={label}")
    cluster.clear_namespace(ns, timeout=240)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=100)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--qps", type=int, default=500, help="kube-scheduler's --kube-api-qps in the second DRA run "
                   "(burst twice that)")
    p.add_argument("--placement-claims", type=int, default=24)
    p.add_argument("--seed", type=int, default=1717)
    p.add_argument("--timeout", type=float, default=300, help="seconds for each burst to settle")
    p.add_argument("--only", choices=("all", "dra", "device-plugin", "placement"), default="all")
    args = p.parse_args()
    mix = sizes(args.seed, args.pods)
    print(f"{args.pods} pods, one share each, seed {args.seed}: "
          f"{sum(g for g, _ in mix)} GiB and {sum(c for _, c in mix)} % cores in all", flush=True)
    if args.only in ("all", "dra", "placement"):
        t0 = time.monotonic()
        with running_dra(DraSpec(nodes=args.nodes, gpus=GPUS, gpu_mib=GPU_MIB)) as cluster:
            print(f"DRA cluster up in {time.monotonic() - t0:.1f} s: {args.nodes} nodes x {GPUS} GPUs x 80 GiB",
                  flush=True)
            if args.only in ("all", "dra"):
                dra_throughput(cluster, mix, args.timeout, "DRA mode, kube-scheduler as shipped (QPS 50, burst 100)")
                qps = [f"--kube-api-qps={args.qps}", f"--kube-api-burst={2 * args.qps}"]
                cluster.restart_scheduler(qps)
                time.sleep(5)  # its informers synced, as in the first run
                dra_throughput(cluster, mix, args.timeout, f"DRA mode, kube-scheduler {' '.join(qps)}")
                cluster.restart_controller_manager(qps)
                time.sleep(5)
                dra_throughput(cluster, mix, args.timeout,
                               f"DRA mode, kube-scheduler and kube-controller-manager {' '.join(qps)}")
                cluster.restart_scheduler()
                time.sleep(5)
                dra_throughput(cluster, mix, args.timeout,
                               f"DRA mode, kube-scheduler as shipped, kube-controller-manager {' '.join(qps)}")
            if args.only in ("all", "placement"):
                seq = sizes(args.seed + 1, args.placement_claims)
                for label in ("binpack", "spread"):
                    placement(cluster, seq, label)
    if args.only in ("all", "device-plugin"):
        device_plugin_throughput(args.nodes, mix, args.timeout, sizes(args.seed + 1, args.placement_claims))
    return 0


if __name__ == "__main__":
    sys.exit(main())
