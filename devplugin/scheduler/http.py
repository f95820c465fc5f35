"""The HTTP layer: Starlette routes that parse bodies with the pydantic models and call the plain functions.

Every body that is not JSON of the expected shape gets 400 and the reason; a body larger than the limit gets 413
before it is read whole (its Content-Length, else as soon as the stream passes the limit). Parsing, validation and
the verbs run in the threadpool, so a large body being parsed does not hold up the event loop that answers the
apiserver's reviews. Only the leader replica answers the extender's verbs (503 elsewhere: kube-scheduler retries).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from devplugin.scheduler import admission, extender
from devplugin.scheduler.extender import BindError, Cluster
from devplugin.scheduler.metrics import SchedulerMetrics
from devplugin.scheduler.models import (
    AdmissionResponse,
    AdmissionReview,
    AdmissionReviewResponse,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    NodeListObject,
    PodObject,
    Problem,
    Status,
)
from devplugin.scheduler.openapi import openapi_document
from devplugin.scheduler.service import DEFAULT_MAX_BODY
from devplugin.scheduler.state import ClusterState

log = logging.getLogger(__name__)

EXTENDER_PREFIX = "/scheduler"
M = TypeVar("M", bound=BaseModel)


class BadRequest(Exception):
    status = 400

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TooLarge(BadRequest):
    status = 413


def _always() -> bool:
    return True


@dataclass
class Service:
    state: ClusterState
    cluster: Cluster | None
    max_body: int = DEFAULT_MAX_BODY
    is_leader: Callable[[], bool] = _always  # only the leader decides and binds
    leader_name: Callable[[], str] = str  # who leads, for followers' answers
    metrics: SchedulerMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = SchedulerMetrics(self.state)


async def _body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > limit:
        raise TooLarge(f"body of {length} bytes exceeds the limit of {limit} bytes (--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"body exceeds the limit of {limit} bytes (--max-body-bytes)")
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        raise BadRequest("empty body; expected a JSON object")
    return body


def _parse(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:5]]
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise BadRequest(f"body is not a valid {model.__name__}: " + "; ".join(parts) + more) from None


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(by_alias=True, exclude_none=True), status_code=status,
                    media_type="application/json")


def _handler(svc: Service, fn: Callable[[Service, bytes], Response], leader_only: bool = False
             ) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        start = time.perf_counter()
        response: Response
        try:
            if leader_only and not svc.is_leader():
                leader = svc.leader_name() or "none yet"
                response = JSONResponse(Problem(error=f"this replica is not the leader (leader: {leader}); "
                                                "retry: the Service routes to the leader").model_dump(),
                                        status_code=503)
            else:
                response = await run_in_threadpool(fn, svc, await _body(request, svc.max_body))
        except BadRequest as exc:
            log.info("bad request: %s", exc.reason, extra={"fields": {"path": request.url.path,
                                                                      "status": exc.status}})
            response = JSONResponse(Problem(error=exc.reason).model_dump(), status_code=exc.status)
        except Exception as exc:  # a bug must not take the service down; kube-scheduler sees an error
            log.exception("handler failed", extra={"fields": {"path": request.url.path}})
            response = JSONResponse(Problem(error=f"internal error: {exc}").model_dump(), status_code=500)
        seconds = time.perf_counter() - start
        svc.metrics.answered(request.url.path, seconds)
        if response.status_code == 500 and request.url.path.endswith("/bind"):
            svc.metrics.bind("error")
        log.debug("request", extra={"fields": {"path": request.url.path, "status": response.status_code,
                                               "ms": round(seconds * 1000, 3)}})
        return response

    return endpoint


def _pod_dict(pod: PodObject) -> dict:
    return pod.model_dump(by_alias=True, exclude_none=True)


def _nodes(args: ExtenderArgs) -> list[dict] | None:
    if args.Nodes is None:
        return None
    return [n.model_dump(by_alias=True, exclude_none=True) for n in args.Nodes.items]


def filter_endpoint(svc: Service, body: bytes) -> Response:
    args = _parse(ExtenderArgs, body)
    nodes = _nodes(args)
    out = extender.filter_nodes(svc.state, _pod_dict(args.Pod), args.NodeNames, nodes)
    svc.metrics.filter(len(out.passed), len(out.failed), len(out.unresolvable))
    result = ExtenderFilterResult(NodeNames=out.passed, FailedNodes=out.failed,
                                  FailedAndUnresolvableNodes=out.unresolvable)
    if args.Nodes is not None:
        keep = set(out.passed)
        result.Nodes = NodeListObject(items=[n for n in args.Nodes.items if n.metadata.name in keep])
        if args.NodeNames is None:
            result.NodeNames = None
    if out.failed or out.unresolvable:
        log.debug("filter", extra={"fields": {"pod": f"{args.Pod.metadata.namespace}/{args.Pod.metadata.name}",
                                              "passed": len(out.passed),
                                              "failed": len(out.failed) + len(out.unresolvable)}})
    return _json(result)


def prioritize_endpoint(svc: Service, body: bytes) -> Response:
    args = _parse(ExtenderArgs, body)
    scores = extender.prioritize(svc.state, _pod_dict(args.Pod), args.NodeNames, _nodes(args))
    # HostPriority's shape, written directly: a model per node costs more than the scoring
    return Response(json.dumps([{"Host": h, "Score": s} for h, s in scores]), media_type="application/json")


def preempt_endpoint(svc: Service, body: bytes) -> Response:
    args = _parse(ExtenderPreemptionArgs, body)
    victims: dict[str, list[str]] = {}
    pdb: dict[str, int] = {}
    for node, meta in (args.NodeNameToMetaVictims or {}).items():
        victims[node], pdb[node] = [p.UID for p in meta.Pods], meta.NumPDBViolations
    for node, full in (args.NodeNameToVictims or {}).items():
        victims[node], pdb[node] = [p.metadata.uid for p in full.Pods], full.NumPDBViolations
    kept = extender.preempt(svc.state, _pod_dict(args.Pod), victims)
    return _json(ExtenderPreemptionResult(NodeNameToMetaVictims={
        node: MetaVictims(Pods=[MetaPod(UID=u) for u in uids], NumPDBViolations=pdb[node])
        for node, uids in kept.items()}))


def bind_endpoint(svc: Service, body: bytes) -> Response:
    args = _parse(ExtenderBindingArgs, body)
    if svc.cluster is None:
        svc.metrics.bind("no_apiserver")
        return _json(ExtenderBindingResult(Error="this service runs without an apiserver; it cannot bind"))
    try:
        extender.bind(svc.state, svc.cluster, args.PodNamespace, args.PodName, args.PodUID, args.Node)
    except BindError as exc:
        svc.metrics.bind("failed")
        log.warning("bind failed: %s", exc, extra={"fields": {"pod": f"{args.PodNamespace}/{args.PodName}",
                                                               "node": args.Node}})
        return _json(ExtenderBindingResult(Error=str(exc)))
    svc.metrics.bind("bound")
    return _json(ExtenderBindingResult())


def _review(body: bytes) -> tuple[AdmissionReview, dict | None]:
    review = _parse(AdmissionReview, body)
    req = review.request
    if req.kind.kind not in ("", "Pod") or req.object is None:
        return review, None
    try:
        PodObject.model_validate(req.object)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        raise BadRequest(f"request.object is not a Pod: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    return review, req.object


def validate_endpoint(svc: Service, body: bytes) -> Response:
    review, pod = _review(body)
    uid = review.request.uid
    if pod is None or review.request.operation not in ("CREATE", "UPDATE"):
        svc.metrics.review("validate", "allowed")
        return _json(AdmissionReviewResponse(response=AdmissionResponse(uid=uid, allowed=True)))
    if review.request.operation == "UPDATE":
        verdict = admission.validate_update(pod, review.request.oldObject or {}, svc.state.domain)
    else:
        verdict = admission.validate(pod, svc.state.largest_gpu_units(), domain=svc.state.domain)
    svc.metrics.review("validate", "allowed" if verdict.allowed else "denied", verdict.rules)
    resp = AdmissionResponse(uid=uid, allowed=verdict.allowed, warnings=list(verdict.warnings) or None)
    if not verdict.allowed:
        resp.status = Status(code=403, reason="Forbidden", message=verdict.message)
        meta = pod.get("metadata") or {}
        who = f"{review.request.namespace}/{meta.get('name') or meta.get('generateName')}"
        log.info("pod denied: %s", verdict.message, extra={"fields": {"pod": who}})
    return _json(AdmissionReviewResponse(response=resp))


def mutate_endpoint(svc: Service, body: bytes) -> Response:
    review, pod = _review(body)
    uid = review.request.uid
    resp = AdmissionResponse(uid=uid, allowed=True)
    if pod is not None and review.request.operation in ("CREATE", "UPDATE"):
        # namespaces opt out through the webhook's namespaceSelector; an UPDATE adds ephemeral containers
        old = (review.request.oldObject or {}) if review.request.operation == "UPDATE" else None
        ops = admission.mutate(pod, old=old)
        if ops:
            resp.patch = base64.b64encode(json.dumps(ops).encode()).decode()
            resp.patchType = "JSONPatch"
    svc.metrics.review("mutate", "patched" if resp.patch else "allowed")
    return _json(AdmissionReviewResponse(response=resp))


def build_app(svc: Service) -> Starlette:
    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        missing = [what for what, ev in (("nodes", svc.state.nodes_synced), ("pods", svc.state.pods_synced))
                   if not ev.is_set()]
        if missing:
            return PlainTextResponse(f"waiting for the first list of {' and '.join(missing)}", status_code=503)
        if not svc.is_leader():  # the Service routes kube-scheduler and the apiserver to the leader alone
            return PlainTextResponse(f"not the leader (leader: {svc.leader_name() or 'none yet'})", status_code=503)
        return PlainTextResponse("ok")

    doc = openapi_document()

    async def openapi(_: Request) -> Response:
        return JSONResponse(doc)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route(f"{EXTENDER_PREFIX}/filter", _handler(svc, filter_endpoint, True), methods=["POST"]),
        Route(f"{EXTENDER_PREFIX}/prioritize", _handler(svc, prioritize_endpoint, True), methods=["POST"]),
        Route(f"{EXTENDER_PREFIX}/preempt", _handler(svc, preempt_endpoint, True), methods=["POST"]),
        Route(f"{EXTENDER_PREFIX}/bind", _handler(svc, bind_endpoint, True), methods=["POST"]),
        Route("/admission/validate", _handler(svc, validate_endpoint), methods=["POST"]),
        Route("/admission/mutate", _handler(svc, mutate_endpoint), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes)
