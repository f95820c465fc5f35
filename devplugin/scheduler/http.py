"""The HTTP layer: Starlette routes that parse bodies with the pydantic models and call the plain functions.

Every body that is not JSON of the expected shape gets 400 and the reason; a body larger than the limit gets 413
before it is read whole (its Content-Length, else as soon as the stream passes the limit). Parsing, validation and
the verbs run in threads, so a large body being parsed does not hold up the event loop. Only the leader replica
answers the extender's verbs (503 elsewhere: kube-scheduler retries).

Admission reviews are bounded apart from the extender's verbs (review_gate.py, review_limits.py): a review takes
one of a few slots before its body is read (fairly between client addresses; 429 when none frees in time), its raw
JSON is refused (413) when it could parse into more values than --max-review-tokens, its pod is denied when it has
more containers or env entries than a review takes, and it runs on threads of its own, so a flood of reviews
neither grows the process without bound nor takes the threads kube-scheduler's calls run on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from devplugin.scheduler import admission, extender, names_body, preempt_body
from devplugin.scheduler.extender import BindError, Cluster
from devplugin.scheduler.log_throttle import LogThrottle
from devplugin.scheduler.metrics import SchedulerMetrics
from devplugin.scheduler.models import (
    AdmissionResponse,
    AdmissionReview,
    AdmissionReviewResponse,
    Container,
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
from devplugin.scheduler.review_gate import Busy, GateSettings, ReviewGate
from devplugin.scheduler.review_limits import DEFAULT_MAX_BODY, ReviewLimits, body_problem, pod_shape_problem
from devplugin.scheduler.state import ClusterState

log = logging.getLogger(__name__)

EXTENDER_PREFIX = "/scheduler"
Body = bytes | bytearray
M = TypeVar("M", bound=BaseModel)
# A review's body must arrive within this once it has a slot: the apiserver sends it at once (its own timeout for
# the whole call is the webhook's timeoutSeconds, 5 s as shipped); a caller that trickles it holds a slot no longer.
BODY_TIMEOUT_S = 3.0


class BadRequest(Exception):
    status = 400

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TooLarge(BadRequest):
    status = 413


class TooSlow(BadRequest):
    status = 408


def _always() -> bool:
    return True


@dataclass
class Service:
    state: ClusterState
    cluster: Cluster | None
    max_body: int = DEFAULT_MAX_BODY
    is_leader: Callable[[], bool] = _always  # only the leader decides and binds
    leader_name: Callable[[], str] = str  # who leads, for followers' answers
    limits: ReviewLimits = ReviewLimits()
    gate_settings: GateSettings = GateSettings()
    metrics: SchedulerMetrics = field(init=False)
    gate: ReviewGate = field(init=False)
    review_threads: CapacityLimiter = field(init=False)  # reviews' own threads; the verbs keep anyio's default pool
    refusals_logged: LogThrottle = field(default_factory=LogThrottle)

    def __post_init__(self) -> None:
        self.metrics = SchedulerMetrics(self.state)
        self.gate = ReviewGate(self.gate_settings)
        self.review_threads = CapacityLimiter(self.gate_settings.slots)


async def _body(request: Request, limit: int) -> bytearray:
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > limit:
        raise TooLarge(f"body of {length} bytes exceeds the limit of {limit} bytes (--max-body-bytes)")
    body = bytearray()  # grown in place: no second copy of the chunks
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            raise TooLarge(f"body exceeds the limit of {limit} bytes (--max-body-bytes)")
        body += chunk
    if not body or body.isspace():
        raise BadRequest("empty body; expected a JSON object")
    return body


def _parse(model: type[M], body: Body) -> M:
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


def _finish(svc: Service, request: Request, start: float, response: Response) -> Response:
    seconds = time.perf_counter() - start
    svc.metrics.answered(request.url.path, seconds)
    if response.status_code == 500 and request.url.path.endswith("/bind"):
        svc.metrics.bind("error")
    log.debug("request", extra={"fields": {"path": request.url.path, "status": response.status_code,
                                           "ms": round(seconds * 1000, 3)}})
    return response


def _bad(svc: Service, request: Request, exc: BadRequest) -> Response:
    fields = {"path": request.url.path, "status": exc.status,
              "client": request.client.host if request.client else "unknown"}
    if svc.refusals_logged.allow():  # a flood of refused posts must not become a flood of log lines
        log.info("bad request: %s", exc.reason,
                 extra={"fields": {**fields, "left_out": svc.refusals_logged.taken_left_out()}})
    return JSONResponse(Problem(error=exc.reason).model_dump(), status_code=exc.status)


def _failed(request: Request, exc: Exception) -> Response:
    log.exception("handler failed", extra={"fields": {"path": request.url.path}})
    return JSONResponse(Problem(error=f"internal error: {exc}").model_dump(), status_code=500)


def _handler(svc: Service, fn: Callable[[Service, Body], Response], leader_only: bool = False
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
            response = _bad(svc, request, exc)
        except Exception as exc:  # a bug must not take the service down; kube-scheduler sees an error
            response = _failed(request, exc)
        return _finish(svc, request, start, response)

    return endpoint


def _review_handler(svc: Service, fn: Callable[[Service, Body], Response]) -> Callable[[Request], Awaitable[Response]]:
    """An admission webhook: a slot of the review gate first, then the body (in time, within the size and token
    bounds), then `fn` on the reviews' own threads."""
    async def endpoint(request: Request) -> Response:
        start = time.perf_counter()
        client = request.client.host if request.client else "unknown"
        response: Response
        try:
            await svc.gate.acquire(client)
        except Busy as exc:
            svc.metrics.refused("busy")
            response = JSONResponse(Problem(error=f"too many admission reviews at once: {exc}").model_dump(),
                                    status_code=429, headers={"Retry-After": "1"})
            return _finish(svc, request, start, response)
        try:
            try:
                body = await asyncio.wait_for(_body(request, svc.max_body), BODY_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise TooSlow(f"the body did not arrive within {BODY_TIMEOUT_S:g} s") from None
            problem = body_problem(body, svc.limits)
            if problem:
                raise TooLarge(problem)
            response = await anyio.to_thread.run_sync(fn, svc, body, limiter=svc.review_threads)
        except BadRequest as exc:
            svc.metrics.refused({408: "slow_body", 413: "too_large"}.get(exc.status, "malformed"))
            response = _bad(svc, request, exc)
        except Exception as exc:  # a bug must not take the service down; the apiserver applies failurePolicy
            response = _failed(request, exc)
        finally:
            svc.gate.release(client)
        return _finish(svc, request, start, response)

    return endpoint


def _pod_dict(pod: PodObject) -> dict:
    return pod.model_dump(by_alias=True, exclude_none=True)


def _nodes(args: ExtenderArgs) -> list[dict] | None:
    if args.Nodes is None:
        return None
    return [n.model_dump(by_alias=True, exclude_none=True) for n in args.Nodes.items]


def _names_call(body: Body) -> tuple[PodObject, list[str]] | None:
    """kube-scheduler's own shape of filter and prioritize, read without the models (names_body.py); None when the
    body has another shape or its pod is not valid (the models then read it, and say what is wrong)."""
    fast = names_body.read(body)
    if fast is None:
        return None
    try:
        return PodObject.model_validate(fast.Pod), fast.NodeNames
    except ValidationError:
        return None


def filter_endpoint(svc: Service, body: Body) -> Response:
    fast = _names_call(body)
    if fast is not None:
        pod, names = fast
        out = extender.filter_nodes(svc.state, _pod_dict(pod), names)
        _filtered(svc, pod, out)
        return Response(names_body.filter_answer(out.passed, out.failed, out.unresolvable),
                        media_type="application/json")
    args = _parse(ExtenderArgs, body)
    nodes = _nodes(args)
    out = extender.filter_nodes(svc.state, _pod_dict(args.Pod), args.NodeNames, nodes)
    _filtered(svc, args.Pod, out)
    result = ExtenderFilterResult(NodeNames=out.passed, FailedNodes=out.failed,
                                  FailedAndUnresolvableNodes=out.unresolvable)
    if args.Nodes is not None:
        keep = set(out.passed)
        result.Nodes = NodeListObject(items=[n for n in args.Nodes.items if n.metadata.name in keep])
        if args.NodeNames is None:
            result.NodeNames = None
    return _json(result)


def _filtered(svc: Service, pod: PodObject, out: extender.FilterOutcome) -> None:
    svc.metrics.filter(len(out.passed), len(out.failed), len(out.unresolvable))
    if out.failed or out.unresolvable:
        log.debug("filter", extra={"fields": {"pod": f"{pod.metadata.namespace}/{pod.metadata.name}",
                                              "passed": len(out.passed),
                                              "failed": len(out.failed) + len(out.unresolvable)}})


def prioritize_endpoint(svc: Service, body: Body) -> Response:
    # HostPriority's shape, written directly: a model per node costs more than the scoring
    fast = _names_call(body)
    if fast is not None:
        pod, names = fast
        return Response(extender.prioritize_json(svc.state, _pod_dict(pod), names), media_type="application/json")
    args = _parse(ExtenderArgs, body)
    return Response(extender.prioritize_json(svc.state, _pod_dict(args.Pod), args.NodeNames, _nodes(args)),
                    media_type="application/json")


def preempt_endpoint(svc: Service, body: Body) -> Response:
    fast = preempt_body.read(body)
    if fast is not None:  # kube-scheduler's own shape: answered without a model per victim
        try:
            pod = _pod_dict(PodObject.model_validate(fast.Pod))
        except ValidationError:
            pod = None  # the models say what is wrong with it, below
        if pod is not None:
            metas = fast.NodeNameToMetaVictims
            nodes = extender.preempt_nodes(svc.state, pod, preempt_body.Victims(metas))
            return Response(preempt_body.answer(nodes, metas), media_type="application/json")
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


def bind_endpoint(svc: Service, body: Body) -> Response:
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


def _review(svc: Service, body: Body) -> tuple[AdmissionReview, dict | None, str]:
    """The review, its pod (None when it is not about one) and why the pod is too large to review ('' if not):
    counts and name sizes are checked on the parsed JSON before any model is built from the pod."""
    review = _parse(AdmissionReview, body)
    req = review.request
    if req.kind.kind not in ("", "Pod") or req.object is None:
        return review, None, ""
    too_large = (pod_shape_problem(req.object, svc.limits)
                 or pod_shape_problem(req.oldObject, svc.limits, "the pod before this update"))
    if too_large:
        return review, req.object, too_large
    _check_pod(req.object)
    return review, req.object, ""


def _check_pod(obj: dict) -> None:
    """BadRequest unless `obj` has the shape of PodObject. Its containers are checked one by one, each a short
    call: one call over a pod of a thousand containers would hold the interpreter for a tenth of a second, and
    kube-scheduler's calls with it."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    lists = {f: spec[f] for f in ("containers", "initContainers") if isinstance(spec.get(f), list)}
    where = ""
    try:
        PodObject.model_validate({**obj, "spec": {**spec, **{f: [] for f in lists}}} if lists else obj)
        for f, items in lists.items():
            for i, c in enumerate(items):
                where = f"spec.{f}.{i}."
                Container.model_validate(c)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        raise BadRequest(f"request.object is not a Pod: {where}{'.'.join(map(str, e['loc']))}: {e['msg']}") from None


def _who(review: AdmissionReview, pod: dict) -> str:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return admission.clip(f"{review.request.namespace}/{meta.get('name') or meta.get('generateName')}", 253)


def _too_large(svc: Service, webhook: str, review: AdmissionReview, pod: dict, why: str) -> Response:
    svc.metrics.review(webhook, "denied", ("pod_shape",))
    if svc.refusals_logged.allow():
        log.info("pod denied: %s", why, extra={"fields": {"pod": _who(review, pod), "webhook": webhook,
                                                           "left_out": svc.refusals_logged.taken_left_out()}})
    return _json(AdmissionReviewResponse(response=AdmissionResponse(
        uid=review.request.uid, allowed=False, status=Status(code=403, reason="Forbidden", message=why))))


def validate_endpoint(svc: Service, body: Body) -> Response:
    review, pod, too_large = _review(svc, body)
    uid = review.request.uid
    if pod is None or review.request.operation not in ("CREATE", "UPDATE"):
        svc.metrics.review("validate", "allowed")
        return _json(AdmissionReviewResponse(response=AdmissionResponse(uid=uid, allowed=True)))
    if too_large:
        return _too_large(svc, "validate", review, pod, too_large)
    if review.request.operation == "UPDATE":
        verdict = admission.validate_update(pod, review.request.oldObject or {}, svc.state.domain)
    else:
        verdict = admission.validate(pod, svc.state.largest_gpu_units(), domain=svc.state.domain,
                                     compute_shares=svc.state.has_mode(admission.COMPUTE_SHARE_MODE))
    svc.metrics.review("validate", "allowed" if verdict.allowed else "denied", verdict.rules)
    resp = AdmissionResponse(uid=uid, allowed=verdict.allowed, warnings=list(verdict.warnings) or None)
    if not verdict.allowed:
        resp.status = Status(code=403, reason="Forbidden", message=verdict.message)
        log.info("pod denied: %s", verdict.message, extra={"fields": {"pod": _who(review, pod)}})
    return _json(AdmissionReviewResponse(response=resp))


def validate_void_endpoint(svc: Service, body: Body) -> Response:
    """The void rule, failing closed: a CPU container cannot be created unmarked when the mutating webhook (which
    fails open) did not run. Registered with the mutating webhook's namespaceSelector."""
    review, pod, too_large = _review(svc, body)
    uid = review.request.uid
    if pod is None or review.request.operation not in ("CREATE", "UPDATE"):
        svc.metrics.review("validate-void", "allowed")
        return _json(AdmissionReviewResponse(response=AdmissionResponse(uid=uid, allowed=True)))
    if too_large:
        return _too_large(svc, "validate-void", review, pod, too_large)
    old = (review.request.oldObject or {}) if review.request.operation == "UPDATE" else None
    verdict = admission.validate_void(pod, old)
    svc.metrics.review("validate-void", "allowed" if verdict.allowed else "denied", verdict.rules)
    resp = AdmissionResponse(uid=uid, allowed=verdict.allowed)
    if not verdict.allowed:
        resp.status = Status(code=403, reason="Forbidden", message=verdict.message)
        log.info("pod denied: %s", verdict.message, extra={"fields": {"pod": _who(review, pod), "webhook": "void"}})
    return _json(AdmissionReviewResponse(response=resp))


def mutate_endpoint(svc: Service, body: Body) -> Response:
    review, pod, too_large = _review(svc, body)
    uid = review.request.uid
    if pod is not None and too_large and review.request.operation in ("CREATE", "UPDATE"):
        return _too_large(svc, "mutate", review, pod, too_large)
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
        Route("/admission/validate", _review_handler(svc, validate_endpoint), methods=["POST"]),
        Route("/admission/mutate", _review_handler(svc, mutate_endpoint), methods=["POST"]),
        Route("/admission/validate-void", _review_handler(svc, validate_void_endpoint), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes)
