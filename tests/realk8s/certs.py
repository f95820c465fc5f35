"""The cluster's PKI, made with openssl: a CA, the apiserver's and the scheduler service's serving certificates
(SANs include 127.0.0.1), client certificates (CN = user, O = groups) and the service-account signing key."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key (PEM files)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Where the CA lives; issue() signs certificates with it."""

    dir: Path
    ca: Pair

    def issue(self, name: str, cn: str, orgs: tuple[str, ...] = (), dns: tuple[str, ...] = (),
              ips: tuple[str, ...] = (), server: bool = False) -> Pair:
        """A key and a certificate signed by the CA, for a client (CN = user, O = groups) or a server (SANs)."""
        key, csr, crt, ext = (self.dir / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
        subject = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", subject, cwd=self.dir)
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        usage = "serverAuth" if server else "clientAuth"
        ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                       f"extendedKeyUsage={usage}\n" + (f"subjectAltName={','.join(sans)}\n" if sans else ""))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca.cert), "-CAkey", str(self.ca.key),
                 "-CAcreateserial", "-out", str(crt), "-days", DAYS, "-extfile", str(ext), cwd=self.dir)
        return Pair(crt, key)


def make_pki(directory: Path) -> Pki:
    """A fresh CA in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Pair(directory / "ca.crt", directory / "ca.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(ca.key), "-out", str(ca.cert), "-days", DAYS, "-subj", "/CN=realk8s-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)
    return Pki(directory, ca)


def service_account_keys(directory: Path) -> Pair:
    """The RSA key the apiserver signs service-account tokens with, and its public half (`cert` holds it)."""
    key, pub = directory / "sa.key", directory / "sa.pub"
    _openssl("genrsa", "-out", str(key), "2048", cwd=directory)
    _openssl("rsa", "-in", str(key), "-pubout", "-out", str(pub), cwd=directory)
    return Pair(pub, key)
