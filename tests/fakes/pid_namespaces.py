"""Running a test's process as the first process of a PID namespace of its own (pid 1 inside), as a container's.

`unshare --user --map-root-user --pid --fork --mount-proc CMD`: unshare forks CMD into the new namespaces and
waits for it; the host pid of CMD is the one child of the unshare process.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]


def require_pid_namespaces() -> None:
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode:
        pytest.skip(f"no PID namespaces here: {probe.stderr.strip()}")


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """argv as pid 1 of a new PID namespace; its stdin and stdout are pipes (text)."""
    return subprocess.Popen([*UNSHARE, *argv], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def host_pid(proc: subprocess.Popen, timeout: float = 10) -> int:
    """The host pid of the namespace's first process (the unshare process's child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        if pids:
            return int(pids[0])
        if proc.poll() is not None:
            raise AssertionError(f"the namespace's process ended early: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.01)
    raise AssertionError(f"unshare {proc.pid} started no process within {timeout} s")
