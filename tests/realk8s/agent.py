"""Launcher and client of the node agent (e2e/cmd/nodeagent): one node's kubelet played with the kubelet's own
device manager, admission and PodResources server.

The agent's command line (keep in step with e2e/cmd/nodeagent/flags.go; a change there lands with this file):
  nodeagent --node-name NAME --root DIR (--kubeconfig FILE | --standalone)
            [--status-period 10s] [--cpu 64] [--memory 256Gi] [--pods 110] [--control-addr 127.0.0.1:0]
            [--plugins-registry-dir DIR] [--cdi-dir DIR ...] [-v N]
It serves <root>/device-plugins/kubelet.sock and <root>/pod-resources/kubelet.sock, and prints one line
`nodeagent: control listening on http://127.0.0.1:PORT` once both serve (with --kubeconfig it then registers the
Node and reads its pods, retrying while the apiserver cannot be reached; it also runs the kubelet's DRA manager and
plugin watcher on --plugins-registry-dir, default <root>/plugins_registry, and resolves CDI devices from --cdi-dir,
default <root>/cdi). Control API: GET /healthz, GET /books, GET /claims and GET /drivers/NAME (with --kubeconfig),
POST /admit (standalone only; a v1.Pod as JSON with metadata.uid) and POST /end ({"uid": ...}); with
--runtime runc (every admitted container runs): POST /exec and GET /logs/NS/POD/CONTAINER.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.realk8s.binaries import binary

READY_PREFIX = "nodeagent: control listening on "


class AgentError(RuntimeError):
    """The agent did not start, or answered with an error."""


class NodeAgent:
    """One node agent process: its own process group, its stderr appended to `log_path` (kept across restarts).
    Standalone (pods come from POST /admit) or with `kubeconfig` (the Node and its pods come from the apiserver,
    as in tests/realk8s/cluster.py)."""

    def __init__(self, root: Path, node_name: str = "node-1", *, kubeconfig: Path | None = None,
                 extra_args: Sequence[str] = (), log_path: Path | None = None,
                 binary_dir: Path | None = None) -> None:
        self.root = Path(root)
        self.binary_dir = binary_dir  # None: e2e/bin (`make e2e-bin`)
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self.extra_args = list(extra_args)
        self.log_path = log_path or self.root / "nodeagent.log"
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None

    @property
    def plugin_dir(self) -> Path:
        """The device plugins' directory, holding the registration socket kubelet.sock."""
        return self.root / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise AgentError("the node agent is not running")
        return self._proc.pid

    def command(self) -> list[str]:
        source = ["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else ["--standalone"]
        exe = self.binary_dir / "nodeagent" if self.binary_dir else binary("nodeagent")
        return [str(exe), "--node-name", self.node_name, "--root", str(self.root), *source,
                *self.extra_args]

    def start(self, timeout: float = 30.0) -> NodeAgent:
        """Start the agent and wait for its control line."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            self._proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log, text=True,
                                          start_new_session=True)
        line: list[str] = []
        proc = self._proc
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""),
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith(READY_PREFIX):
            self.stop()
            raise AgentError(f"the node agent did not report its control address within {timeout}s "
                             f"(stdout {line!r}); its log:\n{self.log_text()}")
        self.url = line[0][len(READY_PREFIX):].strip()
        return self

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the agent's process group and wait; returns its exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        if proc.stdout:
            proc.stdout.close()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL the agent (a crash), leaving its checkpoint as it was."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)
        if proc is not None and proc.stdout:
            proc.stdout.close()

    def restart(self, timeout: float = 30.0) -> NodeAgent:
        """Stop and start again on the same root: the device manager reads its checkpoint."""
        self.stop()
        return self.start(timeout)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        """The last `lines` lines of its log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> NodeAgent:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the control API ---

    def _call(self, method: str, path: str, body: object | None = None, timeout: float = 60.0) -> Any:
        if not self.url:
            raise AgentError("the node agent is not running")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AgentError(f"{method} {path}: HTTP {e.code}: {e.read().decode(errors='replace')}") from e

    def books(self) -> dict[str, Any]:
        """The device manager's books: capacity, allocatable, healthy IDs, pods with their containers' devices."""
        result: dict[str, Any] = self._call("GET", "/books")
        return result

    def admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Admit a pod (standalone agents); returns {"admitted", "reason", "message", "seconds"} once admission
        finished (seconds: the admit handlers' time inside the agent)."""
        result: dict[str, Any] = self._call("POST", "/admit", pod)
        return result

    def end(self, uid: str) -> dict[str, Any]:
        """End a pod: it leaves the active pods and its devices are freed."""
        result: dict[str, Any] = self._call("POST", "/end", {"uid": uid})
        return result

    def exec(self, ns: str, pod: str, container: str, command: Sequence[str], stdin: str | None = None,
             timeout: float = 120) -> dict[str, Any]:
        """Run command in a running container of a pod of this node (`kubectl exec`); {"exitCode", "stdout",
        "stderr", "error"?} once it ended."""
        body: dict[str, Any] = {"namespace": ns, "pod": pod, "container": container, "command": list(command),
                                "timeoutSeconds": timeout}
        if stdin is not None:
            body["stdin"] = stdin
        result: dict[str, Any] = self._call("POST", "/exec", body, timeout=timeout + 30)
        return result

    def logs(self, ns: str, pod: str, container: str, previous: bool = False) -> str:
        """A container's output (`kubectl logs`, `--previous` with previous)."""
        if not self.url:
            raise AgentError("the node agent is not running")
        url = f"{self.url}/logs/{ns}/{pod}/{container}" + ("?previous=true" if previous else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return str(resp.read().decode(errors="replace"))
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            raise AgentError(f"logs of {ns}/{pod}/{container}: HTTP {e.code}: {body}") from e

    def wait_books(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        """Poll the books until pred holds; raises AgentError with the last books otherwise."""
        deadline = time.monotonic() + timeout
        books = self.books()
        while not pred(books):
            if time.monotonic() > deadline:
                summary = {k: books[k] for k in ("capacity", "allocatable")} | {"pods": books["pods"][:20]}
                raise AgentError(f"the books did not reach the expected state within {timeout}s: {summary}")
            time.sleep(0.05)
            books = self.books()
        return books


def pod_manifest(name: str, uid: str, containers: Sequence[dict[str, int]], *,
                 init_containers: Sequence[dict[str, int]] = (), sidecars: Sequence[int] = (),
                 namespace: str = "default", created: str = "") -> dict[str, Any]:
    """A v1.Pod as JSON: one container per dict of resource limits (`c0`, `c1`, ...; init containers `i0`, ...).
    `sidecars` lists the init containers that have restartPolicy Always."""
    def ctr(prefix: str, i: int, limits: dict[str, int]) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": f"{prefix}{i}", "image": "busybox",
                                "resources": {"limits": {k: str(v) for k, v in limits.items()}}}
        if prefix == "i" and i in sidecars:
            spec["restartPolicy"] = "Always"
        return spec
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"initContainers": [ctr("i", i, c) for i, c in enumerate(init_containers)],
                     "containers": [ctr("c", i, c) for i, c in enumerate(containers)]}}


def cleanup_node(root: Path, netns_prefix: str = "", binary_dir: Path | None = None) -> None:
    """`nodeagent cleanup`: every container, mount and pod network namespace a node agent of `root` left."""
    exe = (binary_dir or Path(binary("nodeagent")).parent) / "nodeagent"
    args = [str(exe), "cleanup", "--root", str(root)]
    if netns_prefix:
        args += ["--netns-prefix", netns_prefix]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise AgentError(f"nodeagent cleanup of {root} failed: {proc.stderr}")
