"""`devplugin scheduler`: wire the state, the informers, the apiserver writer and the HTTP app; run uvicorn."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import threading
import time

from devplugin.app import logs
from devplugin.scheduler.state import DEFAULT_ASSUME_TTL_S, ClusterState

log = logging.getLogger(__name__)
ENV_PREFIX = "DEVPLUGIN_SCHEDULER_"
DEFAULT_MAX_BODY = 32 << 20  # a full NodeList from cluster-autoscaler's simulation can be large


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `devplugin scheduler`; each also reads DEVPLUGIN_SCHEDULER_<FLAG> from the environment."""
    p.add_argument("--address", default=_env("address", "0.0.0.0"), help="listen address")
    p.add_argument("--port", type=int, default=int(_env("port", "8443")), help="listen port (HTTPS)")
    p.add_argument("--tls-cert-file", default=_env("tls-cert-file", ""),
                   help="PEM certificate served (reloaded when the file changes)")
    p.add_argument("--tls-private-key-file", default=_env("tls-private-key-file", ""), help="its PEM private key")
    p.add_argument("--plain-http", action="store_true", default=_env("plain-http", "") == "true",
                   help="serve plain HTTP (local trials only: the apiserver calls webhooks over HTTPS)")
    p.add_argument("--kubeconfig", default=_env("kubeconfig", ""),
                   help="kubeconfig (empty: $KUBECONFIG, then the in-cluster service account, then ~/.kube/config)")
    p.add_argument("--assume-ttl", type=float, default=float(_env("assume-ttl", str(DEFAULT_ASSUME_TTL_S))),
                   help="seconds a GPU choice is held for a pod the watch has not yet shown bound")
    p.add_argument("--max-body-bytes", type=int, default=int(_env("max-body-bytes", str(DEFAULT_MAX_BODY))),
                   help="larger request bodies get 400")
    p.add_argument("--log-level", default=_env("log-level", "INFO"),
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.add_argument("--log-format", default=_env("log-format", "json"), choices=("text", "json"))


def check_arguments(args: argparse.Namespace) -> str:
    """Why the flags cannot work, or ''."""
    if not args.plain_http and not (args.tls_cert_file and args.tls_private_key_file):
        return ("--tls-cert-file and --tls-private-key-file are required (the apiserver and kube-scheduler call "
                "over HTTPS); --plain-http serves without TLS for local trials")
    for flag, path in (("--tls-cert-file", args.tls_cert_file), ("--tls-private-key-file", args.tls_private_key_file)):
        if path and not os.path.isfile(path):
            return f"{flag} {path}: no such file"
    if not 0 < args.port < 65536:
        return f"--port {args.port}: must be 1..65535"
    if args.assume_ttl <= 0 or args.max_body_bytes <= 0:
        return "--assume-ttl and --max-body-bytes must be positive"
    return ""


FREEZE_EVERY_S = 300.0


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


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from devplugin.kube.client import KubeConfigError, load_api_client
    from devplugin.scheduler.cluster import KubeCluster
    from devplugin.scheduler.http import Service, build_app
    from devplugin.scheduler.informer import start_informers
    from devplugin.scheduler.tls import CertReloader

    logs.setup(args.log_level, args.log_format)
    state = ClusterState(assume_ttl_s=args.assume_ttl)
    try:
        client = load_api_client(args.kubeconfig)
    except KubeConfigError as exc:
        log.error("%s", exc)
        return 1
    informers = start_informers(client, state)
    svc = Service(state, KubeCluster(client), max_body=args.max_body_bytes)
    tls = {} if args.plain_http else {"ssl_certfile": args.tls_cert_file, "ssl_keyfile": args.tls_private_key_file}
    config = uvicorn.Config(build_app(svc), host=args.address, port=args.port, log_config=None, access_log=False,
                            lifespan="off", **tls)
    config.load()
    reloader = None
    if config.ssl is not None:
        reloader = CertReloader(config.ssl, args.tls_cert_file, args.tls_private_key_file).start()
    stop = threading.Event()

    def housekeeping() -> None:
        frozen_at = 0.0
        while not stop.wait(1.0):
            state.expire()
            frozen_at = freeze_long_lived(state, frozen_at)

    threading.Thread(target=housekeeping, name="housekeeping", daemon=True).start()
    log.info("scheduler extender and webhooks listening",
             extra={"fields": {"address": args.address, "port": args.port, "tls": not args.plain_http}})
    try:
        uvicorn.Server(config).run()
    finally:
        stop.set()
        if reloader:
            reloader.stop()
        for inf in informers:
            inf.stop()
    return 0
