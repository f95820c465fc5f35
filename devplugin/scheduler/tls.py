"""Serve TLS from files and pick up new ones when they change (cert-manager or a Secret update), without a
restart: the SSL context uvicorn serves from is reloaded in place; new connections get the new certificate."""

from __future__ import annotations

import logging
import os
import ssl
import threading

log = logging.getLogger(__name__)


def _signature(*paths: str) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []  # None: the file cannot be read
    for p in paths:
        try:
            st = os.stat(p)  # follows the ..data symlink swap of Secret volumes
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


class CertReloader:
    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str, interval_s: float = 2.0) -> None:
        self.context = context
        self.cert_file, self.key_file = cert_file, key_file
        self.interval_s = interval_s
        self.reloads = 0
        self._seen = _signature(cert_file, key_file)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tls-reload", daemon=True)

    def start(self) -> CertReloader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate is now served."""
        now = _signature(self.cert_file, self.key_file)
        if now == self._seen or None in now:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:  # half-written pair: keep serving the old one, try again
            log.warning("new TLS files do not load (%s); still serving the previous certificate", exc,
                        extra={"fields": {"cert": self.cert_file}})
            return False
        self._seen = now
        self.reloads += 1
        log.info("TLS certificate reloaded", extra={"fields": {"cert": self.cert_file}})
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()
