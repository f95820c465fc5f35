"""What an admission review may cost, checked before it is parsed into Python objects.

A 4 MiB body is cheap as bytes and dear as objects: a pod of 40,000 small containers parses into about 100 MiB of
dicts and models. So a review is refused before parsing when its raw JSON could parse into more than
`max_tokens` values: every JSON value and object key but the first follows one of `{ [ , :`, so the count of those
bytes, taken on the raw body (strings included, so it errs on the side of refusal), bounds what the parser builds.
Once parsed, a pod is checked against `max_containers` (init, app and ephemeral together), `max_env` (env and
envFrom entries of one container) and Kubernetes' own name limit for containers before any model is built from it.
Refused bodies get a clear answer; the pod is never expanded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Kubernetes' limits, for scale: etcd stores objects of at most 1.5 MiB by default, the apiserver reads request
# bodies of at most 3 MiB, and a container name is a DNS label (63 characters).
CONTAINER_NAME_MAX = 63
# The largest body either caller sends (docs/reference/scheduler.md, "Request sizes"; bench/request_sizes.py): an
# AdmissionReview of an UPDATE carries the pod twice, each under the apiserver's 1.5 MiB object limit (about 3.1 MiB
# in all); kube-scheduler's filter for 5,000 nodes with nodeCacheCapable sends names only (about 0.2 MiB) and a pod.
DEFAULT_MAX_BODY = 4 << 20
DEFAULT_MAX_TOKENS = 100_000
DEFAULT_MAX_CONTAINERS = 1_000
DEFAULT_MAX_ENV = 4_096
CONTAINER_FIELDS = ("initContainers", "containers", "ephemeralContainers")
STRUCTURAL = (b"{", b"[", b",", b":")


@dataclass(frozen=True)
class ReviewLimits:
    max_tokens: int = DEFAULT_MAX_TOKENS  # JSON values and keys a review body may parse into
    max_containers: int = DEFAULT_MAX_CONTAINERS  # containers of all kinds in one pod object
    max_env: int = DEFAULT_MAX_ENV  # env + envFrom entries of one container


def json_tokens(body: bytes | bytearray) -> int:
    """An upper bound on the JSON values and keys `body` parses into, from its raw bytes (no parsing)."""
    return 1 + sum(body.count(ch) for ch in STRUCTURAL)


def body_problem(body: bytes | bytearray, limits: ReviewLimits) -> str:
    """Why the raw body is refused before parsing, or ''."""
    tokens = json_tokens(body)
    if tokens > limits.max_tokens:
        return (f"review body of {len(body)} bytes has {tokens} JSON separators ({{ [ , :), more than the "
                f"{limits.max_tokens} a review may parse into (--max-review-tokens); no real pod is this complex: "
                "split it, or raise the flag")
    return ""


def pod_shape_problem(pod: object, limits: ReviewLimits, what: str = "pod") -> str:
    """Why a pod (apiserver JSON, parsed) is too large to review, or ''. Checks counts and name sizes only."""
    if not isinstance(pod, Mapping):
        return ""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return ""
    lists = [(f, spec.get(f)) for f in CONTAINER_FIELDS]
    total = sum(len(items) for _, items in lists if isinstance(items, list))
    if total > limits.max_containers:
        return (f"{what} has {total} containers (init, app and ephemeral), more than the {limits.max_containers} "
                "a review takes (--max-pod-containers); split the workload over several pods")
    for field_name, items in lists:
        if not isinstance(items, list):
            continue
        for i, c in enumerate(items):
            if not isinstance(c, Mapping):
                continue
            name = c.get("name")
            if isinstance(name, str) and len(name) > CONTAINER_NAME_MAX:
                return (f"{what} {field_name}[{i}]: a container name of {len(name)} characters is not a DNS label "
                        f"(at most {CONTAINER_NAME_MAX}, as Kubernetes requires); shorten it")
            entries = sum(len(v) for v in (c.get("env"), c.get("envFrom")) if isinstance(v, list))
            if entries > limits.max_env:
                return (f"{what} {field_name}[{i}] has {entries} env and envFrom entries, more than the "
                        f"{limits.max_env} a review takes (--max-container-env); move them to a ConfigMap "
                        "with envFrom and a prefix")
    return ""
