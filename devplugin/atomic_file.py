"""Replace a file atomically: a temporary file beside it, fsync, chmod, rename, optionally fsync of the directory.
A reader (the container runtime, the shim, a restarted daemon) sees the old file or the new one, never half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int = 0o644, sync_dir: bool = False) -> None:
    """Write `text` to `path` as above (its directory must exist); the temporary file is removed when anything
    fails."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
