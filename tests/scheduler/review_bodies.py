"""AdmissionReview bodies a tenant who can reach the webhooks might post, as bytes: the widest pod that fits the
body bound (tens of thousands of containers), a pod of tens of thousands of reserved env names, the most
expensive pod the service still reviews in full, and the apiserver's review of an ordinary GPU pod."""

from __future__ import annotations

import json

from devplugin.scheduler.review_limits import ReviewLimits, json_tokens
from tests.support.scheduler_objects import container, pod

IMAGE = "registry.example.com/team/inference-server:v1.2.3-" + "0" * 30  # about 80 bytes a container


def review_bytes(obj: dict, uid: str = "flood", op: str = "CREATE") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "resource": {"group": "", "version": "v1", "resource": "pods"},
                                   "namespace": "tenant", "operation": op, "userInfo": {"username": "tenant"},
                                   "object": obj}}, separators=(",", ":")).encode()


def wide_pod(target: int) -> bytes:
    """A review of a pod with as many containers as fit in `target` bytes (36,000 in 3.9 MiB)."""
    n = target // 90
    while True:
        body = review_bytes(pod("wide", containers=[{"name": f"c{i}", "image": IMAGE} for i in range(n)]))
        if len(body) <= target:
            return body
        n = n * 95 // 100


def env_bomb(target: int) -> bytes:
    """A review of one container with as many reserved env names as fit in `target` bytes: each is a problem
    whose message repeats the container's name."""
    n = target // 50
    while True:
        env = [{"name": f"CUDA_DEVICE_{i}", "value": "0"} for i in range(n)]
        body = review_bytes(pod("loud", containers=[{**container("main", mem=1), "env": env}]))
        if len(body) <= target:
            return body
        n = n * 95 // 100


def heaviest_accepted(target: int, limits: ReviewLimits | None = None) -> bytes:
    """The most work a review the limits let through can cost: the most containers a pod may have, each with as
    many reserved env names as the token budget leaves (every one a problem to find and report), and an annotation
    that fills the body to `target` bytes."""
    limits = limits or ReviewLimits()
    n = limits.max_containers
    per_env = max(1, (limits.max_tokens * 95 // 100 - 8 * n) // (5 * n))  # 8 tokens a container, 5 an env

    def build(filler: int) -> bytes:
        containers = [{"name": f"c{i}", "image": "cuda", "env": [{"name": f"CUDA_DEVICE_{j}", "value": "0"}
                                                                 for j in range(per_env)]} for i in range(n)]
        return review_bytes(pod("heavy", containers=containers, annotations={"filler": "x" * filler}))

    body = build(0)
    body = build(max(0, target - len(body)))
    assert json_tokens(body) <= limits.max_tokens, json_tokens(body)
    return body


def legit(uid: str = "apiserver") -> bytes:
    """The apiserver's review of an ordinary GPU pod: a 8 GiB + 20 % container and a sidecar."""
    return review_bytes(pod("train", containers=[container("main", mem=8, core=20), container("sidecar")]), uid)
