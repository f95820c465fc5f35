"""`devplugin scheduler`: wire the state, the informers, the apiserver writer and the HTTP app; run uvicorn."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from devplugin.app import logs
from devplugin.app.http_serving import Bounds, ConnectionGate, bounded_protocol
from devplugin.scheduler.review_gate import DEFAULT_MAX_WAIT_S, DEFAULT_SLOTS
from devplugin.scheduler.review_limits import (
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_CONTAINERS,
    DEFAULT_MAX_ENV,
    DEFAULT_MAX_TOKENS,
)
from devplugin.scheduler.state import DEFAULT_ASSUME_TTL_S, ClusterState

log = logging.getLogger(__name__)
ENV_PREFIX = "DEVPLUGIN_SCHEDULER_"
DEFAULT_ALLOWED_CLIENTS = "kube-scheduler"


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `devplugin scheduler`; each also reads DEVPLUGIN_SCHEDULER_<FLAG> from the environment."""
    p.add_argument("--address", default=_env("address", "0.0.0.0"), help="listen address")
    p.add_argument("--port", type=int, default=int(_env("port", "8443")), help="listen port (HTTPS)")
    p.add_argument("--tls-cert-file", default=_env("tls-cert-file", ""),
                   help="PEM certificate served (reloaded when the file changes)")
    p.add_argument("--tls-private-key-file", default=_env("tls-private-key-file", ""), help="its PEM private key")
    p.add_argument("--client-ca-file", default=_env("client-ca-file", ""),
                   help="PEM CA that signs kube-scheduler's client certificate; the extender's verbs (/scheduler/...) "
                        "answer only clients that present one it signed naming an --allowed-client-names entry")
    p.add_argument("--allowed-client-names", default=_env("allowed-client-names", DEFAULT_ALLOWED_CLIENTS),
                   help="comma-separated names (certificate CN or DNS SAN) allowed to call the extender's verbs")
    p.add_argument("--webhook-client-names", default=_env("webhook-client-names", ""),
                   help="comma-separated names (certificate CN or DNS SAN, signed by --client-ca-file) allowed to call "
                        "the webhooks: the apiserver's, from its AdmissionConfiguration kubeconfig; empty (default): "
                        "the webhooks answer any caller")
    p.add_argument("--plain-http", action="store_true", default=_env("plain-http", "") == "true",
                   help="serve plain HTTP with no caller check (local trials only: the apiserver calls webhooks "
                        "over HTTPS)")
    p.add_argument("--resource-domain", default=_env("resource-domain", "aliyun.com"),
                   help="domain of the resource names pods ask for (<domain>/gpu-mem ...), as the node daemons'")
    p.add_argument("--leader-elect", action="store_true", default=_env("leader-elect", "") == "true",
                   help="run several replicas: only the holder of the Lease decides, binds and is ready")
    p.add_argument("--leader-elect-namespace", default=_env("leader-elect-namespace", "kube-system"))
    p.add_argument("--leader-elect-name", default=_env("leader-elect-name", "devplugin-scheduler"),
                   help="the coordination.k8s.io Lease")
    p.add_argument("--leader-elect-identity", default=_env("leader-elect-identity", os.environ.get("POD_NAME", "")),
                   help="this replica's name in the Lease (default: $POD_NAME)")
    p.add_argument("--leader-elect-lease", type=float, default=float(_env("leader-elect-lease", "3")),
                   help="seconds a leader that stopped renewing keeps the Lease")
    p.add_argument("--leader-elect-renew-deadline", type=float,
                   default=float(_env("leader-elect-renew-deadline", "2")),
                   help="seconds a leader that cannot renew keeps leading (less than the lease)")
    p.add_argument("--leader-elect-retry", type=float, default=float(_env("leader-elect-retry", "0.5")),
                   help="seconds between tries to take or renew the Lease")
    p.add_argument("--kubeconfig", default=_env("kubeconfig", ""),
                   help="kubeconfig (empty: $KUBECONFIG, then the in-cluster service account, then ~/.kube/config)")
    p.add_argument("--assume-ttl", type=float, default=float(_env("assume-ttl", str(DEFAULT_ASSUME_TTL_S))),
                   help="seconds a GPU choice is held for a pod the watch has not yet shown bound")
    p.add_argument("--max-body-bytes", type=int, default=int(_env("max-body-bytes", str(DEFAULT_MAX_BODY))),
                   help="larger request bodies get 413 before they are read whole")
    p.add_argument("--max-review-tokens", type=int,
                   default=int(_env("max-review-tokens", str(DEFAULT_MAX_TOKENS))),
                   help="an admission review whose raw JSON could parse into more values and keys gets 413 unparsed")
    p.add_argument("--max-pod-containers", type=int,
                   default=int(_env("max-pod-containers", str(DEFAULT_MAX_CONTAINERS))),
                   help="a pod with more containers (init, app and ephemeral) is denied before it is reviewed")
    p.add_argument("--max-container-env", type=int, default=int(_env("max-container-env", str(DEFAULT_MAX_ENV))),
                   help="a pod with a container of more env and envFrom entries is denied before it is reviewed")
    p.add_argument("--max-concurrent-reviews", type=int,
                   default=int(_env("max-concurrent-reviews", str(DEFAULT_SLOTS))),
                   help="admission reviews read and judged at once (a quarter of them at most for one client address); "
                        "the others wait their turn, at most --max-review-wait seconds")
    p.add_argument("--max-review-wait", type=float,
                   default=float(_env("max-review-wait", str(DEFAULT_MAX_WAIT_S))),
                   help="seconds a review waits for its turn before it gets 429 (the apiserver then applies the "
                        "webhook's failurePolicy)")
    p.add_argument("--log-level", default=_env("log-level", "INFO"),
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.add_argument("--log-format", default=_env("log-format", "json"), choices=("text", "json"))


def check_arguments(args: argparse.Namespace) -> str:
    """Why the flags cannot work, or ''."""
    if not args.plain_http and not (args.tls_cert_file and args.tls_private_key_file):
        return ("--tls-cert-file and --tls-private-key-file are required (the apiserver and kube-scheduler call "
                "over HTTPS); --plain-http serves without TLS for local trials")
    if not [n for n in args.allowed_client_names.split(",") if n.strip()]:
        return "--allowed-client-names is empty: name kube-scheduler's certificate (its CN or a DNS SAN)"
    if not args.resource_domain or "/" in args.resource_domain:
        return f"--resource-domain {args.resource_domain!r} must be a DNS domain like aliyun.com"
    if args.leader_elect and not args.leader_elect_identity:
        return "--leader-elect needs --leader-elect-identity (default $POD_NAME from the downward API)"
    periods = (args.leader_elect_lease, args.leader_elect_renew_deadline, args.leader_elect_retry)
    if args.leader_elect and not periods[0] > periods[1] > periods[2] > 0:
        return "--leader-elect-lease > --leader-elect-renew-deadline > --leader-elect-retry > 0 is required"
    for flag, path in (("--tls-cert-file", args.tls_cert_file), ("--tls-private-key-file", args.tls_private_key_file),
                       ("--client-ca-file", args.client_ca_file)):
        if path and not os.path.isfile(path):
            return f"{flag} {path}: no such file"
    if not args.plain_http and not args.client_ca_file:
        return ("--client-ca-file is required: the extender's verbs answer only kube-scheduler, by the client "
                "certificate its KubeSchedulerConfiguration presents (--plain-http serves local trials unchecked)")
    if not 0 < args.port < 65536:
        return f"--port {args.port}: must be 1..65535"
    if args.assume_ttl <= 0 or args.max_body_bytes <= 0:
        return "--assume-ttl and --max-body-bytes must be positive"
    bounds = (("--max-review-tokens", args.max_review_tokens), ("--max-pod-containers", args.max_pod_containers),
              ("--max-container-env", args.max_container_env),
              ("--max-concurrent-reviews", args.max_concurrent_reviews))
    for flag, value in bounds:
        if value <= 0:
            return f"{flag} {value}: must be a positive number"
    if not args.max_review_wait > 0:
        return f"--max-review-wait {args.max_review_wait}: must be positive (seconds)"
    if webhook_names(args) and args.plain_http:
        return ("--webhook-client-names needs TLS with --client-ca-file: callers are named by their client "
                "certificate, which --plain-http cannot check")
    return ""


def webhook_names(args: argparse.Namespace) -> list[str]:
    return [n.strip() for n in args.webhook_client_names.split(",") if n.strip()]


FREEZE_EVERY_S = 300.0
# How long a thread may hold the interpreter while another waits for it (CPython's default: 5 ms). An answer to
# the apiserver or kube-scheduler passes between the event loop and a worker thread a few times; each pass waited
# up to the whole interval behind a review being judged. With 1 ms, under a flood of the heaviest reviews the
# limits let through, the apiserver's reviews took 9.7 and 12.6 ms at the median instead of 22 and 19.6
# (bench/webhook_flood.py, docs/benchmarks.md).
SWITCH_INTERVAL_S = 0.001

# How long an idle connection is kept open. Its callers (the apiserver calling the webhooks, kube-scheduler calling
# the extender) reuse idle connections for up to 90 s (Go's http.Transport IdleConnTimeout, which both set). A
# server that closes first races the caller's next request on that connection: the request lands on a socket being
# closed and the caller gets "connection reset by peer" (a POST is not retried), which for a fail-closed webhook
# refuses the pod. uvicorn's default is 5 s; longer than the callers' 90 s, they always close first.
KEEP_ALIVE_S = 100

# What the service's listener holds at most (devplugin/app/http_serving.py). The service is reachable on the
# cluster's network; its callers are the apiserver (a connection per concurrent review) and kube-scheduler, a few
# addresses (the control-plane nodes) with up to hundreds of connections each in a burst of pods. Without bounds a
# connection that sends half a request, or nothing, was held for good: enough of them from a tenant's pods (where
# the shipped NetworkPolicy is not enforced) would exhaust the process's file descriptors, and the fail-closed
# webhooks would refuse every GPU pod of the cluster. A whole request must arrive within 10 s of its first byte
# (or of the connection's opening); an idle kept-alive connection is kept KEEP_ALIVE_S; past the caps a new
# connection closes the oldest one waiting for a request (idle or half-sent), or is closed at once.
SERVICE_BOUNDS = Bounds(max_connections=1024, max_per_client=256, request_timeout_s=10.0, keep_alive_s=KEEP_ALIVE_S,
                        max_head_bytes=16384)


# Python collects its oldest generation on its own once enough objects have survived two younger collections.
# That pass walks every object not frozen (the nodes' and pods' objects changed since the last freeze, thousands
# of them in a busy cluster) and lands on whichever call is running: with the cluster frozen, a request that
# parsed 20,000 objects (a preemption over 5,000 nodes) set one off every other call, up to 80 ms each
# (docs/benchmarks.md). Here the oldest generation is collected by the housekeeping thread alone, every
# FREEZE_EVERY_S (collect_oldest, freeze_long_lived); the young generations are collected as Python does.
OLDEST_NEVER_ON_ITS_OWN = 1 << 30


def collect_oldest_on_schedule() -> None:
    """Stop Python from collecting the oldest generation on its own (see OLDEST_NEVER_ON_ITS_OWN)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, OLDEST_NEVER_ON_ITS_OWN)


def collect_oldest(collected_at: float, now: float | None = None) -> float:
    """A full collection every FREEZE_EVERY_S (cyclic garbage that outlived two young collections is freed
    there); returns when it last collected."""
    now = time.monotonic() if now is None else now
    if collected_at and now - collected_at < FREEZE_EVERY_S:
        return collected_at
    gc.collect()
    return now


def freeze_long_lived(state: ClusterState, frozen_at: float, now: float | None = None) -> float:
    """Move the objects alive now (the cluster's nodes and pods) out of the cyclic GC's reach, once the first
    lists are in and then every FREEZE_EVERY_S: a full collection over 10,000 pods' objects takes 60..200 ms,
    which would land on a filter call now and then. Returns when it last froze."""
    now = time.monotonic() if now is None else now
    if not (state.nodes_synced.is_set() and state.pods_synced.is_set()):
        return frozen_at
    if frozen_at and now - frozen_at < FREEZE_EVERY_S:
        return frozen_at
    gc.collect()
    gc.freeze()
    log.debug("long-lived objects frozen", extra={"fields": {"frozen": gc.get_freeze_count()}})
    return now


def server_config(app: Any, host: str, port: int, cert_file: str = "", key_file: str = "", client_ca_file: str = "",
                  allowed_clients: Sequence[str] = (DEFAULT_ALLOWED_CLIENTS,),
                  webhook_clients: Sequence[str] = (), bounds: Bounds = SERVICE_BOUNDS) -> Any:
    """A loaded uvicorn.Config serving `app`: over TLS when cert_file is given, asking every client for a certificate
    signed by client_ca_file, with the extender's verbs open only to `allowed_clients` and the webhooks to
    `webhook_clients` when it names any (devplugin.scheduler.auth), and connections held within `bounds`. Without
    cert_file: plain HTTP, no caller check (local trials)."""
    import ssl

    import uvicorn

    from devplugin.scheduler.auth import ExtenderAuth, PeerNames, noting_peers

    tls: dict[str, Any] = {}
    peers = PeerNames()
    if cert_file:
        tls = {"ssl_certfile": cert_file, "ssl_keyfile": key_file, "ssl_ca_certs": client_ca_file or None,
               "ssl_cert_reqs": ssl.CERT_OPTIONAL if client_ca_file else ssl.CERT_NONE}
        app = ExtenderAuth(app, peers, [n.strip() for n in allowed_clients if n.strip()],
                           [n.strip() for n in webhook_clients if n.strip()])
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="off",
                            http="h11", timeout_keep_alive=bounds.keep_alive_s,
                            h11_max_incomplete_event_size=bounds.max_head_bytes, **tls)
    config.load()
    if cert_file:
        config.http_protocol_class = noting_peers(config.http_protocol_class, peers)
    # outermost: a connection refused by the gate is never noted nor served
    config.http_protocol_class = bounded_protocol(config.http_protocol_class, ConnectionGate(bounds, "scheduler"),
                                                  idle_kept_alive=True)
    return config


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from devplugin.kube.client import KubeConfigError, load_api_client
    from devplugin.scheduler.cluster import KubeCluster
    from devplugin.scheduler.http import Service, build_app
    from devplugin.scheduler.informer import start_informers
    from devplugin.scheduler.leader import LeaderElector
    from devplugin.scheduler.review_gate import GateSettings
    from devplugin.scheduler.review_limits import ReviewLimits
    from devplugin.scheduler.tls import CertReloader

    logs.setup(args.log_level, args.log_format)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    state = ClusterState(assume_ttl_s=args.assume_ttl, domain=args.resource_domain)
    try:
        client = load_api_client(args.kubeconfig)
    except KubeConfigError as exc:
        log.error("%s", exc)
        return 1
    informers = start_informers(client, state)
    svc = Service(state, KubeCluster(client), max_body=args.max_body_bytes,
                  limits=ReviewLimits(args.max_review_tokens, args.max_pod_containers, args.max_container_env),
                  gate_settings=GateSettings(args.max_concurrent_reviews, args.max_review_wait))
    elector = None
    if args.leader_elect:
        elector = LeaderElector(client, args.leader_elect_namespace, args.leader_elect_name,
                                args.leader_elect_identity, args.leader_elect_lease,
                                args.leader_elect_renew_deadline, args.leader_elect_retry)
        svc.is_leader, svc.leader_name = elector.is_leader, elector.leader
    config = server_config(build_app(svc), args.address, args.port,
                           "" if args.plain_http else args.tls_cert_file,
                           "" if args.plain_http else args.tls_private_key_file,
                           "" if args.plain_http else args.client_ca_file,
                           args.allowed_client_names.split(","), webhook_names(args))
    reloader = None
    if config.ssl is not None:
        reloader = CertReloader(config.ssl, args.tls_cert_file, args.tls_private_key_file).start()
    stop = threading.Event()

    collect_oldest_on_schedule()

    def housekeeping() -> None:
        frozen_at, collected_at = 0.0, time.monotonic()
        while not stop.wait(1.0):
            state.expire()
            frozen = freeze_long_lived(state, frozen_at)
            if frozen != frozen_at:  # freezing collected everything first
                frozen_at = collected_at = frozen
            collected_at = collect_oldest(collected_at)

    threading.Thread(target=housekeeping, name="housekeeping", daemon=True).start()
    if elector is not None:
        elector.start()
    log.info("scheduler extender and webhooks listening",
             extra={"fields": {"address": args.address, "port": args.port, "tls": not args.plain_http,
                               "client_ca": args.client_ca_file, "leader_elect": args.leader_elect,
                               "webhook_clients": webhook_names(args) or "anyone",
                               "concurrent_reviews": args.max_concurrent_reviews}})
    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            if elector is not None:  # stop deciding and hand the Lease over now, not after the connections close
                elector.stop(release=True)
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    try:
        Server(config).run()
    finally:
        stop.set()
        if elector is not None:
            elector.stop(release=True)  # the next replica takes over at its next try
        if reloader:
            reloader.stop()
        for inf in informers:
            inf.stop()
    return 0
