"""Who may read /metrics when `--metrics-auth kubernetes`: the caller's bearer token is reviewed by the apiserver,
as kube-rbac-proxy and controller-runtime's authenticated metrics filter do. A TokenReview says who the token
belongs to; a SubjectAccessReview says whether that user may `get` the non-resource URL `/metrics` (RBAC:
`nonResourceURLs: ["/metrics"], verbs: ["get"]`, what Prometheus's ClusterRole and the shipped
gpushare-metrics-reader grant). The node component's own ServiceAccount needs `create` on tokenreviews and
subjectaccessreviews (deploy/base/rbac.yaml).

Answers are remembered by a digest of the token (never the token): an allowed one for ALLOWED_TTL_S, a refused one
for REFUSED_TTL_S, at most MAX_REMEMBERED of them; a scraper every 30 s costs the apiserver two reviews a minute.
An apiserver that does not answer gives 503 and nothing is remembered.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
# The apiserver's pod proxy drops the Authorization header once it has authenticated its caller, and passes other
# headers on: `devplugin inspect` sends a token through it here (the header oauth2-proxy gives its upstreams).
FORWARDED_TOKEN_HEADER = "X-Forwarded-Access-Token"
READER_ACCOUNT = "gpushare-metrics-reader"  # the ServiceAccount allowed get /metrics (deploy/base/metrics-reader.yaml)
ALLOWED_TTL_S = 60.0
REFUSED_TTL_S = 10.0
MAX_REMEMBERED = 256
REVIEW_TIMEOUT_S = 5.0
GRANT = 'nonResourceURLs: ["/metrics"], verbs: ["get"]'


class ApiserverError(RuntimeError):
    """A review could not be asked or answered; the message says which and why."""


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    status: int  # 200 allowed, 401 not authenticated, 403 not allowed, 503 could not be checked
    reason: str = ""
    user: str = ""


Authenticate = Callable[[str], "User | None"]
Authorize = Callable[[User], "tuple[bool, str]"]


class TokenCheck:
    """A token's verdict from `authenticate` (TokenReview: the user, or None) and `authorize` (SubjectAccessReview:
    allowed, and the apiserver's reason), remembered a while. Thread-safe."""

    def __init__(self, authenticate: Authenticate, authorize: Authorize) -> None:
        self.authenticate = authenticate
        self.authorize = authorize
        self.remembered: dict[str, tuple[float, Verdict]] = {}  # token digest -> (until, verdict)
        self._lock = threading.Lock()

    def verdict(self, token: str) -> Verdict:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self.remembered.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        try:
            verdict = self._review(token)
        except ApiserverError as exc:  # the caller is not known yet: the reason goes to the log, not to it
            log.warning("metrics: cannot check a token with the apiserver: %s", exc)
            return Verdict(503, "cannot check the token with the apiserver (the daemon's log says why); retry")
        ttl = ALLOWED_TTL_S if verdict.status == 200 else REFUSED_TTL_S
        with self._lock:
            self.remembered.pop(key, None)
            while len(self.remembered) >= MAX_REMEMBERED:  # the oldest first (dicts keep insertion order)
                self.remembered.pop(next(iter(self.remembered)))
            self.remembered[key] = (now + ttl, verdict)
        return verdict

    def _review(self, token: str) -> Verdict:
        user = self.authenticate(token)
        if user is None:
            return Verdict(401, "the apiserver does not know this token (TokenReview: not authenticated)")
        allowed, why = self.authorize(user)
        if not allowed:
            log.info("metrics: %s may not get %s: %s", user.name, METRICS_PATH, why or "no rule allows it",
                     extra={"fields": {"user": user.name}})
            return Verdict(403, f"{user.name} may not get {METRICS_PATH} ({why or 'no rule allows it'}): grant it "
                                f"{GRANT} in a ClusterRole bound to it", user.name)
        return Verdict(200, "", user.name)


def bearer_token(authorization_header: str, forwarded_header: str = "") -> str:
    """The token of an `Authorization: Bearer <token>` header's value, else of an X-Forwarded-Access-Token one,
    or ''."""
    scheme, _, token = authorization_header.strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return forwarded_header.strip()


def _message(body: object) -> str:
    """The message of an apiserver Status in `body`, else the body's start."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    try:
        status = json.loads(text)
    except ValueError:
        return text[:300]
    return str(status.get("message", text[:300])) if isinstance(status, dict) else text[:300]


def _answer(call: Callable[[], Any], what: str) -> dict[str, Any]:
    """The JSON object a review call (`_preload_content=False`) answered; ApiserverError naming `what` otherwise."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        data = call().data
    except ApiException as exc:
        raise ApiserverError(f"{what}: HTTP {exc.status} {exc.reason}: {_message(exc.body)}") from None
    except (HTTPError, OSError) as exc:
        raise ApiserverError(f"{what}: {exc}") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise ApiserverError(f"{what}: the answer is not JSON") from None
    if not isinstance(answer, dict):
        raise ApiserverError(f"{what}: the answer is not an object")
    return answer


def kube_reviews(api_client: Any) -> tuple[Authenticate, Authorize]:
    """TokenReview and SubjectAccessReview (`get` on /metrics) through `api_client` (a kubernetes ApiClient)."""
    from kubernetes import client

    # Any: plain dicts in and raw answers out (_preload_content=False), which the client takes but does not describe
    authentication: Any = client.AuthenticationV1Api(api_client)
    authorization: Any = client.AuthorizationV1Api(api_client)

    def authenticate(token: str) -> User | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        answer = _answer(lambda: authentication.create_token_review(
            body, _preload_content=False, _request_timeout=REVIEW_TIMEOUT_S), "TokenReview")
        status = answer.get("status") or {}
        if status.get("error") and not status.get("authenticated"):
            log.debug("metrics: TokenReview refused a token: %s", status["error"])
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        return User(name=str(user.get("username", "")), uid=str(user.get("uid", "")),
                    groups=tuple(str(g) for g in user.get("groups") or ()),
                    extra={str(k): [str(x) for x in v] for k, v in (user.get("extra") or {}).items()})

    def authorize(user: User) -> tuple[bool, str]:
        spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups),
                                "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"}}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = user.extra
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        answer = _answer(lambda: authorization.create_subject_access_review(
            body, _preload_content=False, _request_timeout=REVIEW_TIMEOUT_S), "SubjectAccessReview")
        status = answer.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or status.get("evaluationError") or "")

    return authenticate, authorize
