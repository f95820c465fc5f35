"""The cluster churn at scale on real Kubernetes (tests/realk8s: etcd, kube-apiserver, kube-scheduler, 4 node agents
with the kubelet's device manager, `devplugin serve` on the fake driver, `devplugin scheduler`): seeded pods of
1 or 2 containers (1..40 GiB, 5..60 %, 5 % whole GPUs) created in bursts, a share of the running ones deleted
after each burst; once with kube-scheduler calling the extender, once with the plain kube-scheduler (same seed).

Prints, for each: create-to-Running p50 / p99 (from the watch), admissions (pods Running) per second over the
run, refusals by the nodes by cause, pods left Pending while a node had room, and the audit of the kubelets'
books (device IDs held twice, containers split, envs that disagree with gpushare.io/allocated).

Run: .venv/bin/python bench/cluster_churn.py [--pods 1500] [--seed 1414] [--nodes 4] [--burst 24]
Needs e2e/bin (`make e2e-bin`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.realk8s.churn import run_churn  # noqa: E402
from tests.realk8s.cluster import Spec, running  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=1500)
    p.add_argument("--seed", type=int, default=1414)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--burst", type=int, default=24)
    p.add_argument("--delete-fraction", type=float, default=0.35)
    p.add_argument("--only", choices=("both", "extender", "plain"), default="both")
    args = p.parse_args()
    with running(Spec(nodes=args.nodes)) as cluster:
        print(f"cluster up in {cluster.took:.1f} s: {args.nodes} nodes x 8 GPUs x 80 GiB")
        failed = False
        for extender in (True, False):
            if args.only != "both" and extender != (args.only == "extender"):
                continue
            cluster.use_scheduler(extender)
            ns = cluster.namespace("bench")
            res = run_churn(cluster.core, ns, cluster.books, seed=args.seed, pods=args.pods, burst=args.burst,
                            delete_fraction=args.delete_fraction, settle_s=60)
            title = "with the extender" if extender else "plain kube-scheduler"
            print(res.report(title))
            audit = cluster.audit()
            print(f"  audit of the kubelets' books: {len(audit)} violation(s)")
            for line in audit[:20]:
                print(f"    {line}")
            if res.pending_with_room:
                print(f"  pending while a node had room: {res.pending_with_room[:10]}")
            failed |= bool(audit) or (extender and bool(res.refused or res.pending_with_room))
            cluster.clear_namespace(ns, timeout=180)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
