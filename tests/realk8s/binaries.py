"""Where `make e2e-bin` puts the real components, and a clear error when one is missing."""

from __future__ import annotations

from pathlib import Path

E2E_BIN = Path(__file__).resolve().parents[2] / "e2e" / "bin"


def binary(name: str) -> Path:
    """The path of e2e/bin/<name>; raises FileNotFoundError saying how to build it."""
    path = E2E_BIN / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make e2e-bin` (needs Go 1.26; e2e/README.md)")
    return path
