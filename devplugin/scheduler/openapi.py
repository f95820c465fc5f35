"""The service's OpenAPI 3.1 document, built from the pydantic models (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

from devplugin.scheduler.models import (
    AdmissionReview,
    AdmissionReviewResponse,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    Problem,
)

_ROUTES: list[tuple[str, type[BaseModel], Any, str]] = [
    ("/scheduler/filter", ExtenderArgs, ExtenderFilterResult, "scheduler extender: filter nodes"),
    ("/scheduler/prioritize", ExtenderArgs, list[HostPriority], "scheduler extender: score nodes 0..10"),
    ("/scheduler/preempt", ExtenderPreemptionArgs, ExtenderPreemptionResult,
     "scheduler extender: keep the eviction plans that free room on a GPU"),
    ("/scheduler/bind", ExtenderBindingArgs, ExtenderBindingResult, "scheduler extender: choose GPUs and bind"),
    ("/admission/validate", AdmissionReview, AdmissionReviewResponse, "validating admission webhook"),
    ("/admission/mutate", AdmissionReview, AdmissionReviewResponse, "mutating admission webhook"),
    ("/admission/validate-void", AdmissionReview, AdmissionReviewResponse,
     "validating admission webhook: CPU containers carry the mutating webhook's void"),
]


def openapi_document() -> dict[str, Any]:
    models: list[type[BaseModel]] = [ExtenderArgs, ExtenderFilterResult, HostPriority, ExtenderPreemptionArgs,
                                      ExtenderPreemptionResult, ExtenderBindingArgs, ExtenderBindingResult,
                                      AdmissionReview, AdmissionReviewResponse, Problem]
    refs, defs = models_json_schema([(m, "validation") for m in models],
                                    ref_template="#/components/schemas/{model}")
    paths: dict[str, Any] = {}
    problem = {"application/json": {"schema": refs[(Problem, "validation")]}}
    for path, req, resp, summary in _ROUTES:
        if resp == list[HostPriority]:
            resp_schema = TypeAdapter(list[HostPriority]).json_schema(ref_template="#/components/schemas/{model}")
        else:
            resp_schema = refs[(resp, "validation")]
        paths[path] = {"post": {
            "summary": summary,
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": refs[(req, "validation")]}}},
            "responses": {
                "200": {"description": "answer", "content": {"application/json": {"schema": resp_schema}}},
                "400": {"description": "malformed body", "content": problem},
                "413": {"description": "body over --max-body-bytes, or a review over --max-review-tokens",
                        "content": problem},
            },
        }}
        if path.startswith("/admission/"):
            paths[path]["post"]["responses"].update({
                "408": {"description": "the body did not arrive in time", "content": problem},
                "429": {"description": "no review slot freed within --max-review-wait", "content": problem}})
        else:
            paths[path]["post"]["responses"]["503"] = {"description": "not the leader", "content": problem}
    for path in ("/healthz", "/readyz"):
        paths[path] = {"get": {"responses": {"200": {"description": "ok"}, "503": {"description": "not ready"}}}}
    return {"openapi": "3.1.0", "info": {"title": "devplugin scheduler", "version": "1"}, "paths": paths,
            "components": {"schemas": defs.get("$defs", {})}}
