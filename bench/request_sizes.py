"""The largest bodies the service's callers send, against its bound (--max-body-bytes, default 4 MiB).

kube-scheduler (nodeCacheCapable: true, as shipped) sends the pod and the node names: 5,000 names of a typical
length (27 characters, `ip-10-0-123-45.ec2.internal`) and of the longest a node name can be (253); the pod as
the apiserver stores it, up to etcd's default request limit of 1.5 MiB. The apiserver sends an AdmissionReview:
on CREATE the pod once, on UPDATE the pod and its old version (each up to 1.5 MiB). Prints each size in bytes.

Run: .venv/bin/python bench/request_sizes.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devplugin.scheduler.review_limits import DEFAULT_MAX_BODY  # noqa: E402
from tests.support.scheduler_objects import container, pod  # noqa: E402

ETCD_LIMIT = 1536 * 1024  # etcd's --max-request-bytes default: no stored pod is larger


def big_pod(target: int) -> dict:
    """A pod whose JSON is about `target` bytes (annotations fill it, as a large one would be)."""
    p = pod("large", containers=[container("main", mem=4)])
    base = len(json.dumps(p))
    p["metadata"]["annotations"]["filler"] = "x" * max(target - base - 20, 0)
    return p


def size(obj: object) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def main() -> int:
    typical = pod("train", containers=[container("main", mem=8, core=20)])
    rows = []
    for length in (27, 253):
        names = [f"{i:05d}".rjust(length, "n") for i in range(5000)]
        rows.append((f"filter, 5,000 node names of {length} chars, a typical pod",
                     size({"Pod": typical, "NodeNames": names})))
        rows.append((f"filter, 5,000 node names of {length} chars, a 1.5 MiB pod",
                     size({"Pod": big_pod(ETCD_LIMIT), "NodeNames": names})))
    rows.append(("bind", size({"PodName": "p" * 253, "PodNamespace": "n" * 63, "PodUID": "u" * 36,
                               "Node": "n" * 253})))
    request = {"uid": "u" * 36, "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
               "userInfo": {"username": "system:serviceaccount:default:deployer", "groups": ["a", "b"]}}
    rows.append(("AdmissionReview CREATE, a 1.5 MiB pod",
                 size({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {**request, "operation": "CREATE", "object": big_pod(ETCD_LIMIT)}})))
    rows.append(("AdmissionReview UPDATE, a 1.5 MiB pod and its old version",
                 size({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {**request, "operation": "UPDATE", "object": big_pod(ETCD_LIMIT),
                                   "oldObject": big_pod(ETCD_LIMIT)}})))
    for name, n in rows:
        print(f"{name:<62} {n:>9,} bytes  {n / DEFAULT_MAX_BODY:6.1%} of the {DEFAULT_MAX_BODY >> 20} MiB bound")
    return 0 if all(n <= DEFAULT_MAX_BODY for _, n in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
