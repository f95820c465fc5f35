"""Test certificates made with the openssl command: a CA and the leaves it signs (server and client)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         "-keyout", str(key), "-out", str(cert))
    return cert, key


def make_leaf(directory: Path, ca: tuple[Path, Path], cn: str, usage: str, dns: tuple[str, ...] = ()
              ) -> tuple[Path, Path]:
    """A certificate for `cn` signed by `ca`; usage: serverAuth or clientAuth."""
    stem = f"{ca[0].stem}-{cn}-{usage}-{'-'.join(dns)}"
    cert, key, csr, ext = (directory / (stem + s) for s in (".crt", ".key", ".csr", ".cnf"))
    lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             f"extendedKeyUsage={usage}"]
    if dns:
        lines.append("subjectAltName=" + ",".join(f"DNS:{d}" for d in dns))
    ext.write_text("\n".join(lines) + "\n")
    _run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", str(key), "-out", str(csr))
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial", "-days", "1",
         "-extfile", str(ext), "-out", str(cert))
    return cert, key
