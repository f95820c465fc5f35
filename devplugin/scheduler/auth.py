"""Who may call the extender's verbs (kube-scheduler alone) and the webhooks (anyone, or the apiserver alone), by
mutual TLS.

The service asks every client for a certificate (CERT_OPTIONAL, verified against --client-ca-file): kube-scheduler
presents the one its KubeSchedulerConfiguration names (tlsConfig.certFile/keyFile); the apiserver presents one only
when its AdmissionConfiguration gives it a kubeconfig for the webhooks (docs/guide/install.md). A certificate that does
not verify ends the TLS handshake (unknown CA). For paths under /scheduler/ the verified certificate must name an
allowed client (its subject CN or a DNS SAN); under /admission/ too when --webhook-client-names names any (else the
webhooks answer anyone). Anything else gets 403 with the reason and a log line, before the body is read. uvicorn
does not put the peer certificate in the ASGI scope, so the HTTP protocol is wrapped to note each connection's
verified names by its client address.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Collection
from typing import Any

from devplugin.scheduler.log_throttle import LogThrottle

log = logging.getLogger(__name__)

PROTECTED_PREFIX = "/scheduler/"
WEBHOOK_PREFIX = "/admission/"
Address = tuple[str, int]


def certificate_names(cert: dict[str, Any] | None) -> tuple[str, ...]:
    """The subject CN(s) and DNS SANs of a verified peer certificate (ssl.SSLSocket.getpeercert()); () if none."""
    if not cert:
        return ()
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    names += [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]
    return tuple(dict.fromkeys(names))


class PeerNames:
    """Client address -> the names of its verified certificate, for the connections open now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_addr: dict[Address, tuple[str, ...]] = {}

    def opened(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        ssl_object = transport.get_extra_info("ssl_object")
        if not isinstance(peer, tuple) or ssl_object is None:
            return
        self.note((str(peer[0]), int(peer[1])), certificate_names(ssl_object.getpeercert()))

    def note(self, addr: Address, names: tuple[str, ...]) -> None:
        """Record a connection's verified names (what `opened` does from the TLS handshake)."""
        with self._lock:
            self._by_addr[addr] = names

    def closed(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            with self._lock:
                self._by_addr.pop((str(peer[0]), int(peer[1])), None)

    def names(self, addr: Address | None) -> tuple[str, ...]:
        if addr is None:
            return ()
        with self._lock:
            return self._by_addr.get((str(addr[0]), int(addr[1])), ())


def noting_peers(protocol_class: type, peers: PeerNames) -> type:
    """A subclass of uvicorn's HTTP protocol class that records each connection's certificate names."""

    class PeerNoting(protocol_class):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peers.opened(transport)
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            peers.closed(self.transport)
            super().connection_lost(exc)

    PeerNoting.__name__ = f"PeerNoting{protocol_class.__name__}"
    return PeerNoting


def refusal(names: Collection[str], allowed: Collection[str]) -> str:
    """Why a caller with these certificate names may not call the extender's verbs, or ''."""
    wanted = ", ".join(sorted(allowed))
    if not names:
        return ("the extender's verbs answer only kube-scheduler: present a client certificate signed by the CA "
                f"of --client-ca-file and naming one of: {wanted} (KubeSchedulerConfiguration extenders[].tlsConfig"
                ".certFile/keyFile)")
    if not set(names) & set(allowed):
        return (f"client certificate names {', '.join(names)}, which may not call the extender's verbs; "
                f"allowed: {wanted} (--allowed-client-names)")
    return ""


def webhook_refusal(names: Collection[str], allowed: Collection[str]) -> str:
    """Why a caller with these certificate names may not call the webhooks, or '' (anyone may when none is named)."""
    if not allowed or set(names) & set(allowed):
        return ""
    wanted = ", ".join(sorted(allowed))
    if not names:
        return ("the webhooks answer only the apiserver: present a client certificate signed by the CA of "
                f"--client-ca-file and naming one of: {wanted} (the apiserver's AdmissionConfiguration kubeconfig, "
                "docs/guide/install.md)")
    return (f"client certificate names {', '.join(names)}, which may not call the webhooks; allowed: {wanted} "
            "(--webhook-client-names)")


class ExtenderAuth:
    """ASGI middleware: paths under /scheduler/ need a verified certificate naming an allowed client; paths under
    /admission/ one naming a webhook client, when any is named."""

    def __init__(self, app: Any, peers: PeerNames, allowed: Collection[str],
                 webhook_allowed: Collection[str] = ()) -> None:
        self.app = app
        self.peers = peers
        self.allowed = tuple(allowed)
        self.webhook_allowed = tuple(webhook_allowed)
        self.logged = LogThrottle()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        extender = path.startswith(PROTECTED_PREFIX)
        if scope["type"] != "http" or not (extender or (self.webhook_allowed and path.startswith(WEBHOOK_PREFIX))):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        names = self.peers.names((str(client[0]), int(client[1])) if client else None)
        why = refusal(names, self.allowed) if extender else webhook_refusal(names, self.webhook_allowed)
        if not why:
            await self.app(scope, receive, send)
            return
        who = f"{client[0]}:{client[1]}" if client else "unknown"
        if self.logged.allow():
            log.warning("caller refused: %s", why, extra={"fields": {"client": who, "path": path, "names": list(names),
                                                                      "left_out": self.logged.taken_left_out()}})
        body = json.dumps({"error": why}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
