"""The cluster's components as local processes: each in its own process group, its output in a log file, started
again with the same command after a kill, stopped by group (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (bound to port 0, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ComponentFailed(RuntimeError):
    """A component exited or never became ready; the message carries the end of its log."""


@dataclass
class Proc:
    """One component: a command, its env, its log file; start() again after kill() or stop()."""

    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    popen: subprocess.Popen | None = None
    starts: int = 0

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")
        out.write(f"===== start {self.starts + 1}: {' '.join(self.cmd)}\n".encode())
        out.flush()
        self.popen = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        self.starts += 1
        return self

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the whole group and reap it."""
        self.signal_group(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=10)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the group; SIGKILL what is left after `grace` seconds."""
        if self.popen is None:
            return
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # children left in the group
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def failed(self, why: str) -> ComponentFailed:
        return ComponentFailed(f"{self.name}: {why}\n--- last lines of {self.log} ---\n{self.tail()}")

    def wait_for_line(self, pattern: str, timeout: float, since: int = 0) -> re.Match[str]:
        """The first match of `pattern` in the log after offset `since` (characters); fail if the process exits
        or the time runs out."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.text(), since)
            if m:
                return m
            if not self.running:
                raise self.failed(f"exited (code {self.popen.returncode if self.popen else None}) "
                                  f"before printing /{pattern}/")
            if time.monotonic() > deadline:
                raise self.failed(f"did not print /{pattern}/ within {timeout:.0f} s")
            time.sleep(0.05)

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll `ready` until true; fail if the process exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not ready yet (connection refused, 503, ...)
                pass
            if not self.running:
                raise self.failed(f"exited (code {self.popen.returncode if self.popen else None}) before {what}")
            if time.monotonic() > deadline:
                raise self.failed(f"not {what} within {timeout:.0f} s")
            time.sleep(0.1)
