"""One container, at most one CDI device of this driver.

Each request of a prepared claim is one CDI device whose edits set NVIDIA_VISIBLE_DEVICES and the shim's limits
(one limits file, one accounting file, at fixed paths in the container). Two such devices in one container would
set the same env and mount the same paths, and which one wins is the runtime's choice: the container could end up
with one request's GPUs and the other's limits. So a container that would get two (two claims of this driver, or
a claim with two requests taken whole) is refused at prepare, with a message that says what to do. A claim (or a
request) used by two containers, or by two pods, is one share with one budget: they all get the same CDI device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from devplugin import contract
from devplugin.dra.checkpoint import PreparedClaim
from devplugin.dra.claims import ClaimRef

log = logging.getLogger(__name__)

MAX_PODS = 8  # pods of one call whose spec is read
ReadPod = Callable[[str, str], object]  # (namespace, name) -> the Pod as JSON
CachedPod = Callable[[str, str, str], "dict | None"]  # (namespace, name, UID) -> the Pod, when known with that UID


def our_requests(claim: object) -> set[str]:
    """The claim's requests (base names) that have results of this driver."""
    if not isinstance(claim, dict):
        return set()
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        return set()
    return {r["request"].split("/", 1)[0] for r in results if isinstance(r, dict) and
            r.get("driver") == contract.DRA_DRIVER and isinstance(r.get("request"), str)}


def _obj(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def reserved_pods(claim: object) -> list[tuple[str, str, str]]:
    """(namespace, name, UID) of the pods a claim is reserved for (UID '' when the entry has none)."""
    if not isinstance(claim, dict):
        return []
    ns = str((claim.get("metadata") or {}).get("namespace", ""))
    out = []
    for r in (claim.get("status") or {}).get("reservedFor") or []:
        if isinstance(r, dict) and r.get("resource") == "pods" and isinstance(r.get("name"), str):
            uid = r.get("uid")
            out.append((ns, r["name"], uid if isinstance(uid, str) else ""))
    return out


def pod_claim_names(pod: Mapping[str, object]) -> dict[str, str]:
    """The pod's claim reference name -> the ResourceClaim's name (direct, or generated from a template)."""
    spec, status = _obj(pod.get("spec")), _obj(pod.get("status"))
    generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
                 if isinstance(s, dict)}
    out = {}
    for ref in spec.get("resourceClaims") or []:
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
            continue
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        if isinstance(name, str):
            out[ref["name"]] = name
    return out


def containers_with_two(pod: Mapping[str, object], ours: Mapping[str, set[str]]) -> list[tuple[str, list[str]]]:
    """(container, the claim requests of this driver it would get) for every container that would get more than
    one. `ours`: claim name -> its requests with results of this driver."""
    names = pod_claim_names(pod)
    spec = _obj(pod.get("spec"))
    bad = []
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            if not isinstance(c, dict):
                continue
            got: set[str] = set()
            for r in _obj(c.get("resources")).get("claims") or []:
                claim = names.get(r.get("name", "")) if isinstance(r, dict) else None
                if claim is None or claim not in ours:
                    continue
                request = r.get("request") or ""
                wanted = {request.split("/", 1)[0]} & ours[claim] if request else ours[claim]
                got |= {f"{claim}/{q}" for q in wanted}
            if len(got) > 1:
                bad.append((str(c.get("name", "?")), sorted(got)))
    return bad


def names_every_claim(pod: object) -> bool:
    """Every claim the pod's spec lists resolves to a ResourceClaim name (a claim from a template does once the
    controller has written it in status.resourceClaimStatuses)."""
    if not isinstance(pod, dict):
        return False
    refs = _obj(pod.get("spec")).get("resourceClaims") or []
    return len(pod_claim_names(pod)) == len([r for r in refs if isinstance(r, dict)])


class ConflictCheck:
    """Reads the pods a call's claims are reserved for and refuses claims that share a container. A pod comes from
    `cached` (devplugin/dra/pods.py: the pods the watch shows on this node) when it holds it with the UID the claim
    is reserved for and with every claim named, else from the apiserver (`read_pod`)."""

    def __init__(self, read_pod: ReadPod, cached: CachedPod | None = None) -> None:
        self.read_pod = read_pod
        self.cached = cached
        self.reads = 0  # pods read from the apiserver (a pod the watch did not show yet, or without a cache)

    def _pod(self, ns: str, name: str, uid: str) -> object:
        pod = self.cached(ns, name, uid) if self.cached is not None and uid else None
        if pod is not None and _obj(pod.get("metadata")).get("uid") == uid and names_every_claim(pod):
            return pod
        self.reads += 1
        return self.read_pod(ns, name)

    def check(self, refs: Sequence[ClaimRef], claims: Mapping[str, object],
              prepared: Mapping[str, PreparedClaim]) -> dict[str, str]:
        """UID -> why the claim cannot be prepared ("" or absent: fine)."""
        ours_by_ns: dict[str, dict[str, set[str]]] = {}
        for ref in refs:
            requests = our_requests(claims.get(ref.uid))
            if requests:
                ours_by_ns.setdefault(ref.namespace, {})[ref.name] = requests
        for p in prepared.values():
            ours_by_ns.setdefault(p.namespace, {})[p.name] = {r for d in p.devices for r in d.request_names}
        pods = list(dict.fromkeys(pod for ref in refs for pod in reserved_pods(claims.get(ref.uid))))[:MAX_PODS]
        out: dict[str, str] = {}
        for ns, name, uid in pods:
            try:
                pod = self._pod(ns, name, uid)
            except Exception as exc:  # noqa: BLE001 - a pod that cannot be read is not checked, and the log says so
                log.warning("cannot read pod %s/%s to check its containers' claims: %s", ns, name, exc,
                            extra={"fields": {"namespace": ns, "pod": name}})
                continue
            if not isinstance(pod, dict):
                continue
            for container, got in containers_with_two(pod, ours_by_ns.get(ns, {})):
                msg = (f"container {container} of pod {ns}/{name} would get {len(got)} requests of "
                       f"{contract.DRA_DRIVER} ({', '.join(got)}): a container gets one set of GPUs and one limits "
                       "file, so ask for what it needs in one request (count: N for several GPUs), or give each "
                       "request its own container (resources.claims[].request)")
                claim_names = {g.split("/", 1)[0] for g in got}
                for ref in refs:
                    if ref.namespace == ns and ref.name in claim_names:
                        out[ref.uid] = f"claim {ref}: {msg}"
        return out
