"""The product's own image for the test cluster, built here from the repository's Dockerfile: no registry can be
reached, so the image is a root filesystem directory plus its config (ENV, WORKDIR, ENTRYPOINT, CMD, USER), an entry
of the node agents' image table (tests/realk8s/images.py, e2e/internal/images).

1. The base: Debian 12 from Debian's own packages (`mmdebstrap --variant=minbase`), with Python 3.11 as `python` and
   `pip` in /usr/local (a venv there, first on PATH) as the shipped base python:3.11-slim-bookworm has them,
   imported into buildah's storage under the cache directory (`--storage-driver vfs`, never the machine's default
   storage). Cached by a key of its inputs (suite, packages, the Python step, the config).
2. The image: `buildah build --build-arg BASE=<that base>` of the Dockerfile, from a copy of exactly what the
   Dockerfile copies (its COPY sources less what .dockerignore leaves out). Its RUN steps reach Debian's mirror
   and PyPI with this machine's trust (the CA bundle pip is given here, bound into the RUN steps only).
3. The export: the image's root filesystem copied out of buildah's storage (`buildah mount`), its config read
   with `buildah inspect`.

A build is kept under the cache directory by a key of the Dockerfile, the files it copies and the base: a session
whose sources did not change reuses it at the cost of copying and hashing those files (well under a second).

`python -m tests.realk8s.product_image [CACHE_DIR]` builds (or reuses) it, logs each step's time and prints the
table entry.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.dockerfile_parse import copy_sources, parse

REPO = Path(__file__).resolve().parents[2]
REFERENCE = "gpushare/devplugin:0.1.0"  # the image the shipped manifests and the Helm chart name
DEFAULT_CACHE = REPO / "build" / "product-image"
SUITE = "bookworm"
# python:3.11-slim-bookworm is Debian 12 with these (its runtime packages) and Python 3.11 in /usr/local.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "netbase", "tzdata")
BASE_PYTHON = ["python3", "-m", "venv", "/usr/local"]
BASE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
# Where the build's RUN steps find pip's config and CA bundle (bound for the RUN steps only: pip reads
# /etc/xdg/pip/pip.conf); the empty mount point buildah leaves is removed from the export.
PIP_TRUST_DIR = "/etc/xdg/pip"
TOOLS_HINT = "`make realk8s-tools` installs runc, buildah and mmdebstrap (apt-get, as root)"
TAIL_LINES = 40

log = logging.getLogger(__name__)


class ImageBuildError(RuntimeError):
    """A step of the image build failed: the message says which, the tail of its output, and what to do."""


def _run(step: str, argv: list[str], timeout: float, hint: str = "", output: Path | None = None) -> str:
    """Run one step; its output also goes to `output` when given. Raises ImageBuildError when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise ImageBuildError(f"{step}: {argv[0]} is missing: {TOOLS_HINT}") from e
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise ImageBuildError(f"{step}: still running after {timeout:.0f} s: {' '.join(argv)}\n"
                              f"{_tail(out)}") from e
    if output is not None:
        output.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        where = f" (all of it in {output})" if output is not None else ""
        raise ImageBuildError(f"{step} failed (exit status {done.returncode}): {' '.join(argv)}\n"
                              f"--- last {TAIL_LINES} lines of its output{where} ---\n"
                              f"{_tail(done.stdout + done.stderr)}\n"
                              f"--- {hint or 'fix the cause above, then run the tests again'}")
    return done.stdout


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-TAIL_LINES:])


def require_tools() -> None:
    """Root and the build tools, or a clear error saying what to do."""
    if os.geteuid() != 0:
        raise ImageBuildError("building the product's image needs root (mmdebstrap's root mode, buildah's chroot "
                              "isolation and `buildah mount` of vfs storage): run the tests as root")
    missing = [tool for tool in ("mmdebstrap", "buildah") if shutil.which(tool) is None]
    if missing:
        raise ImageBuildError(f"{', '.join(missing)} missing: {TOOLS_HINT}")


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def base_key() -> str:
    """The key of the base image's inputs: a change to any of them makes a new base."""
    return _digest({"suite": SUITE, "variant": "minbase", "packages": BASE_PACKAGES, "python": BASE_PYTHON,
                    "env": BASE_ENV})


def base_image() -> str:
    return f"localhost/gpushare-base:{base_key()}"


def buildah(cache_dir: Path) -> list[str]:
    """buildah on the cache directory's own vfs storage."""
    return ["buildah", "--root", str(cache_dir / "storage"), "--runroot", str(cache_dir / "storage-run"),
            "--storage-driver", "vfs"]


def _has_image(cache_dir: Path, name: str) -> bool:
    done = subprocess.run([*buildah(cache_dir), "images", "--quiet", name], capture_output=True, text=True,
                          timeout=120)
    return done.returncode == 0 and bool(done.stdout.strip())


def ensure_base(cache_dir: Path) -> str:
    """The base image in the cache's storage (made when missing); returns its name."""
    name = base_image()
    if _has_image(cache_dir, name):
        return name
    tarball = cache_dir / f"base-{base_key()}.tar"
    if not tarball.exists():
        started = time.monotonic()
        partial = tarball.with_suffix(".tar.partial")
        _run("mmdebstrap (the Debian 12 base)",
             ["mmdebstrap", "--variant=minbase", "--format=tar", f"--include={','.join(BASE_PACKAGES)}", SUITE,
              str(partial)],
             timeout=1800, hint="mmdebstrap needs Debian's mirror (deb.debian.org) and root; check both")
        partial.rename(tarball)
        log.info("step=mmdebstrap seconds=%.1f tarball=%s", time.monotonic() - started, tarball)
    started = time.monotonic()
    b = buildah(cache_dir)
    container = _run("buildah from scratch", [*b, "from", "scratch"], timeout=120).strip()
    try:
        _run("buildah add (the base's files)", [*b, "add", container, str(tarball), "/"], timeout=900)
        _run("python3 -m venv /usr/local (the base's python and pip)",
             [*b, "run", "--isolation", "chroot", container, "--", *BASE_PYTHON], timeout=600)
        config = [arg for env in BASE_ENV for arg in ("--env", env)]
        _run("buildah config (the base's ENV)", [*b, "config", *config, "--cmd", '["python3"]', container],
             timeout=60)
        _run("buildah commit (the base)", [*b, "commit", "--rm", container, name], timeout=900)
    except ImageBuildError:
        subprocess.run([*b, "rm", container], capture_output=True, timeout=120)
        raise
    tarball.unlink()  # the storage holds it now
    log.info("step=base-import seconds=%.1f image=%s", time.monotonic() - started, name)
    return name


# --- the build context: what the Dockerfile copies, less what .dockerignore leaves out ----------------------------

def _pattern(glob: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over '/'-separated relative paths: `**` any depth, `*` and `?` within a
    name, `[...]` a character class."""
    out, i = "", 0
    glob = glob.strip("/")
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        elif glob[i] == "[":
            end = glob.index("]", i)
            out, i = out + glob[i:end + 1], end + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out)


def ignore_rules(dockerignore: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, pattern) for each line of a .dockerignore, in order; `!` lines include again."""
    rules = []
    for line in dockerignore.read_text().splitlines() if dockerignore.exists() else []:
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((not line.startswith("!"), _pattern(line.lstrip("!"))))
    return rules


def ignored(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context leaves out `rel`: the last rule matching it or a folder above it decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for excludes, pattern in rules:
        if any(pattern.fullmatch(p) for p in prefixes):
            verdict = excludes
    return verdict


def context_sources(repo: Path) -> list[str]:
    """The repository paths the Dockerfile's COPY instructions take from the build context."""
    sources: list[str] = []
    for stage in parse(repo / "Dockerfile"):
        for instruction in stage.all("COPY"):
            paths, _, origin = copy_sources(instruction)
            if origin is None:
                sources += [p.strip("/") for p in paths if p.strip("/") not in sources]
    return sources


def stage_context(repo: Path, dest: Path) -> str:
    """Copy into `dest` (emptied first) the Dockerfile, .dockerignore and what the Dockerfile copies, less what
    .dockerignore leaves out; returns the key of that content (paths, executable bits, bytes)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    rules = ignore_rules(repo / ".dockerignore")
    for name in ("Dockerfile", ".dockerignore"):
        if (repo / name).exists():
            shutil.copy2(repo / name, dest / name)
    for source in context_sources(repo):
        path = repo / source
        if not path.exists():
            raise ImageBuildError(f"the Dockerfile copies {source}, which is not in {repo}")
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink())
        for file in files:
            rel = file.relative_to(repo).as_posix()
            if ignored(rel, rules):
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, dest / rel, follow_symlinks=False)
    digest = hashlib.sha256()
    for file in sorted(p for p in dest.rglob("*") if not p.is_dir()):
        rel = file.relative_to(dest).as_posix()
        content = os.readlink(file).encode() if file.is_symlink() else file.read_bytes()
        digest.update(f"{rel}\0{file.lstat().st_mode & 0o111:o}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()[:16]


# --- build, export, the table entry ---------------------------------------------------------------------------------

def _pip_trust(cache_dir: Path) -> Path:
    """pip's config for the build's RUN steps: this machine's CA bundle (PIP_CERT, REQUESTS_CA_BUNDLE or
    SSL_CERT_FILE, else the system bundle) and index (PIP_INDEX_URL), as pip on this machine is given them."""
    trust = cache_dir / "pip-trust"
    trust.mkdir(parents=True, exist_ok=True)
    lines = ["[global]"]
    candidates = [os.environ.get(v, "") for v in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")]
    bundle = next((Path(c) for c in [*candidates, "/etc/ssl/certs/ca-certificates.crt"] if c and Path(c).is_file()),
                  None)
    if bundle is not None:
        shutil.copyfile(bundle, trust / "ca.crt")
        lines.append(f"cert = {PIP_TRUST_DIR}/ca.crt")
    if os.environ.get("PIP_INDEX_URL"):
        lines.append(f"index-url = {os.environ['PIP_INDEX_URL']}")
    (trust / "pip.conf").write_text("\n".join(lines) + "\n")
    return trust


def _resolve_user(rootfs: Path, user: str) -> str:
    """The image's USER as uid:gid (names looked up in the image's /etc/passwd and /etc/group); root when unset."""
    name, _, group = (user or "0").partition(":")
    passwd = [line.split(":") for line in (rootfs / "etc/passwd").read_text().splitlines() if line.count(":") >= 6]
    groups = [line.split(":") for line in (rootfs / "etc/group").read_text().splitlines() if line.count(":") >= 2]
    entry = next((p for p in passwd if name in (p[0], p[2])), None)
    if entry is None and not name.isdigit():
        raise ImageBuildError(f"the image's USER {user!r} is not in its /etc/passwd")
    uid = entry[2] if entry else name
    if group:
        found = next((g[2] for g in groups if group in (g[0], g[2])), group if group.isdigit() else None)
        if found is None:
            raise ImageBuildError(f"the image's USER {user!r}: no group {group!r} in its /etc/group")
        return f"{uid}:{found}"
    return f"{uid}:{entry[3] if entry else 0}"


def _export(cache_dir: Path, image: str, dest: Path) -> dict[str, Any]:
    """Copy the image's root filesystem to dest/rootfs; returns its table entry."""
    b = buildah(cache_dir)
    config = json.loads(_run("buildah inspect (the image's config)", [*b, "inspect", "--type", "image", image],
                             timeout=120))
    container = _run("buildah from (the image, for its files)", [*b, "from", "--pull=never", image],
                     timeout=600).strip()
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        mounted = _run("buildah mount", [*b, "mount", container], timeout=120).strip()
        _run("copying the image's files", ["cp", "-a", "--reflink=auto", f"{mounted}/.", str(partial / "rootfs")],
             timeout=900)
    finally:
        subprocess.run([*b, "umount", container], capture_output=True, timeout=120)
        subprocess.run([*b, "rm", container], capture_output=True, timeout=300)
    trust_mount = partial / "rootfs" / PIP_TRUST_DIR.strip("/")
    for leftover in (trust_mount, trust_mount.parent):
        if leftover.is_dir() and not any(leftover.iterdir()):
            leftover.rmdir()
    oci = config["OCIv1"]["config"]
    rootfs = dest / "rootfs"
    entry: dict[str, Any] = {
        "rootfs": str(rootfs),
        "env": list(oci.get("Env") or []),
        "workingDir": oci.get("WorkingDir") or "/",
        "entrypoint": list(oci.get("Entrypoint") or []),
        "cmd": list(oci.get("Cmd") or []),
        "user": _resolve_user(partial / "rootfs", oci.get("User") or ""),
        "id": f"sha256:{config['FromImageID']}",
    }
    (partial / "entry.json").write_text(json.dumps(entry, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
    return entry


@contextmanager
def _locked(cache_dir: Path) -> Iterator[None]:
    """One build at a time per cache directory (test sessions may start together)."""
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _forget_old_builds(products: Path, keep: Path) -> None:
    """Keep this build and the one before it (a cluster still running may use it); remove the others."""
    others = sorted((p for p in products.iterdir() if p.is_dir() and p != keep), key=lambda p: p.stat().st_mtime)
    for old in others[:-1]:
        shutil.rmtree(old, ignore_errors=True)


def build(cache_dir: Path, *, repo: Path = REPO) -> dict[str, Any]:
    """The product's image (the Dockerfile of `repo`, this checkout by default) as an image-table entry for
    REFERENCE: its root filesystem under `cache_dir`, its ENV, WORKDIR, ENTRYPOINT, CMD, USER (as uid:gid) and image
    ID. Built only when the Dockerfile, what it copies or the base changed; raises ImageBuildError saying what
    failed."""
    cache_dir = cache_dir.resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir):
        started = time.monotonic()
        context = cache_dir / "context"
        key = _digest({"context": stage_context(repo, context), "base": base_key(), "reference": REFERENCE})
        products = cache_dir / "product"
        dest = products / key
        if (dest / "entry.json").exists():
            entry: dict[str, Any] = json.loads((dest / "entry.json").read_text())
            log.info("step=reuse seconds=%.1f key=%s rootfs=%s", time.monotonic() - started, key, entry["rootfs"])
            return entry
        require_tools()
        base = ensure_base(cache_dir)
        started = time.monotonic()
        b = buildah(cache_dir)
        _run("buildah build (the repository's Dockerfile)",
             [*b, "build", "--isolation", "chroot", "--pull=never", "--format", "docker",
              "--volume", f"{_pip_trust(cache_dir)}:{PIP_TRUST_DIR}:ro", "--build-arg", f"BASE={base}",
              "--tag", REFERENCE, "--file", str(context / "Dockerfile"), str(context)],
             timeout=3600, output=cache_dir / "build.log",
             hint="the output says which step failed; the RUN steps download from Debian's mirror and PyPI: "
                  "check that both can be reached, then run again")
        log.info("step=build seconds=%.1f", time.monotonic() - started)
        started = time.monotonic()
        try:
            entry = _export(cache_dir, REFERENCE, dest)
        finally:
            subprocess.run([*b, "rmi", REFERENCE], capture_output=True, timeout=300)  # its files are exported
        log.info("step=export seconds=%.1f rootfs=%s", time.monotonic() - started, entry["rootfs"])
        _forget_old_builds(products, dest)
        return entry


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.realk8s.product_image",
                                     description="Build (or reuse) the product's image; print its table entry.")
    parser.add_argument("cache_dir", nargs="?", type=Path, default=DEFAULT_CACHE,
                        help=f"where the base, the build's storage and the image's files are kept (default "
                             f"{DEFAULT_CACHE.relative_to(REPO)})")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose Dockerfile is built")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    started = time.monotonic()
    try:
        entry = build(args.cache_dir, repo=args.repo.resolve())
    except ImageBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    log.info("step=total seconds=%.1f", time.monotonic() - started)
    print(json.dumps({REFERENCE: entry}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
