"""Read the DRA objects `inspect` reports on: the ResourceSlices, the ResourceClaims (resource.k8s.io/v1) and the
claim policies' limit (ConfigMap kube-system/gpushare-dra-limits), as raw JSON through the kubernetes client."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

LIMITS_NAMESPACE, LIMITS_NAME, LIMITS_KEY = "kube-system", "gpushare-dra-limits", "largestGpuMemory"


@dataclass
class DraObjects:
    slices: list[dict]
    claims: list[dict]
    limit: str  # "" when not set, or the ConfigMap could not be read
    available: bool  # False: the apiserver serves no resource.k8s.io/v1 (Kubernetes before 1.34)


def read_dra(api_client: Any, node: str = "", timeout_s: float = 30.0) -> DraObjects:
    """The slices (of `node` only when named), every claim, and the limit. A cluster without resource.k8s.io/v1
    gives empty lists (available False); other API errors (403: inspect's account may not list them) raise."""
    resource: Any = client.ResourceV1Api(api_client)
    selector = {"field_selector": f"spec.nodeName={node}"} if node else {}
    try:
        slices = json.loads(resource.list_resource_slice(_preload_content=False, _request_timeout=timeout_s,
                                                         **selector).data).get("items") or []
    except ApiException as exc:
        if exc.status == 404:
            return DraObjects([], [], "", False)
        raise
    claims = json.loads(resource.list_resource_claim_for_all_namespaces(
        _preload_content=False, _request_timeout=timeout_s).data).get("items") or []
    return DraObjects(slices, claims, read_limit(api_client, timeout_s), True)


def read_limit(api_client: Any, timeout_s: float = 30.0) -> str:
    """largestGpuMemory of the claim policies' ConfigMap; "" when absent or not readable by this account."""
    core: Any = client.CoreV1Api(api_client)
    try:
        cm = json.loads(core.read_namespaced_config_map(LIMITS_NAME, LIMITS_NAMESPACE, _preload_content=False,
                                                        _request_timeout=timeout_s).data)
    except ApiException:
        return ""
    return str((cm.get("data") or {}).get(LIMITS_KEY, "")).strip()
