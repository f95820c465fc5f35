"""The kubelet's own stub device plugin (e2e/cmd/stubplugin) as a process."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.realk8s.binaries import binary


class StubPlugin:
    """`stubplugin --resource R --devices N --plugin-dir DIR`: registers R with N devices (dev-0 ... dev-N-1)."""

    def __init__(self, plugin_dir: Path, resource: str, devices: int, *, socket_name: str = "stub.sock",
                 log_path: Path | None = None) -> None:
        self.plugin_dir, self.resource, self.devices = Path(plugin_dir), resource, devices
        self.socket_name = socket_name
        self.log_path = log_path or self.plugin_dir.parent / f"stub-{socket_name}.log"
        self._proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> StubPlugin:
        cmd = [str(binary("stubplugin")), "--resource", self.resource, "--devices", str(self.devices),
               "--plugin-dir", str(self.plugin_dir), "--socket-name", self.socket_name]
        with open(self.log_path, "a") as log:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.startswith("stubplugin: registered"):
            self.stop()
            raise RuntimeError(f"the stub plugin did not register: {line!r}\n{self.log_path.read_text()}")
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if proc.stdout:
            proc.stdout.close()

    def __enter__(self) -> StubPlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
