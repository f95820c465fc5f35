"""The demo's cluster: a fake apiserver holding the node and its pods, a kubelet emulator, and `devplugin serve`
as a real process linked to both.

A pod goes the way it does on a real node: it is created in the apiserver already bound to the node (as the
scheduler's Binding leaves it), then the kubelet admits it, calling the daemon over the device-plugin gRPC
sockets. What the daemon tells the cluster is read back from the apiserver: the pod's `gpushare.io/allocated`
annotation, its Events, and the node's `gpushare.io/gpu-usage` annotation.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from devplugin import contract as c
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver
from devplugin_sim.kubelet import AdmitResult, KubeletEmulator
from devplugin_sim.pods import ContainerSpec, PodSpec

NODE = "gpu-node-1"
NAMESPACE = "default"
T = TypeVar("T")


def until(probe: Callable[[], T | None], timeout: float) -> T | None:
    """probe() until it answers something truthy, at most `timeout` seconds; its last answer."""
    end = time.monotonic() + timeout
    while True:
        got = probe()
        if got or time.monotonic() >= end:
            return got
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod_spec(pod: dict) -> PodSpec:
    """The kubelet's view of an apiserver pod: name, uid and each container's limits."""
    def limits(container: dict) -> dict[str, int]:
        raw = (container.get("resources") or {}).get("limits") or {}
        return {k: int(v) for k, v in raw.items()}

    meta, spec = pod["metadata"], pod["spec"]
    return PodSpec(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                   containers=[ContainerSpec(c["name"], limits(c)) for c in spec["containers"]],
                   init_containers=[ContainerSpec(c["name"], limits(c)) for c in spec.get("initContainers") or []])


class DemoCluster:
    """The node's apiserver objects, its kubelet and (while one runs) its daemon process."""

    def __init__(self, root: Path, driver: FakeDriver, api: FakeApiserver, kubelet: KubeletEmulator,
                 shim_args: list[str]) -> None:
        self.root = root
        self.driver = driver
        self.api = api
        self.kubelet = kubelet
        self.shim_args = shim_args
        self.log_path = root / "daemon.log"
        self.daemon: subprocess.Popen | None = None
        self.health_port = 0

    # --- the daemon ---------------------------------------------------------------------------------------------
    def serve(self) -> list[str]:
        """Start `devplugin serve` linked to the fake apiserver; the command line, shortened for the reader."""
        self.health_port = free_port()
        args = ["--node-name", NODE, "--kubeconfig", self.api.kubeconfig_path,
                "--health-port", str(self.health_port), "--state-dir", str(self.root / "state"),
                "--plugin-dir", str(self.kubelet.plugin_dir),
                "--pod-resources-socket", str(self.kubelet.pod_resources_socket), *self.shim_args]
        env = {**os.environ, **self.driver.env(), "PYTHONUNBUFFERED": "1"}
        self.daemon = subprocess.Popen([sys.executable, "-m", "devplugin", "serve", *args], env=env,
                                       stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT)
        return ["devplugin", "serve", "--node-name", NODE, "--kubeconfig", "<fake apiserver>",
                "--health-port", str(self.health_port)]

    def readyz(self) -> tuple[int, str]:
        """GET /readyz on the daemon's health port: (HTTP status, body); (0, why) when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=1) as resp:
                return resp.status, resp.read().decode().strip()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode().strip()
        except OSError as exc:
            return 0, str(exc)

    def stop_daemon(self) -> int:
        """SIGTERM, as the kubelet stops the DaemonSet's pod; the exit code."""
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGTERM)
        try:
            return self.daemon.wait(timeout=15)
        finally:
            self.daemon = None

    def kill_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()
            self.daemon.wait(timeout=15)
            self.daemon = None

    # --- the node -----------------------------------------------------------------------------------------------
    def label_node(self, labels: dict[str, str]) -> None:
        self.api.patch_node(NODE, {"metadata": {"labels": labels}})

    def node_usage(self) -> c.NodeUsage | None:
        raw = (self.api.node(NODE)["metadata"].get("annotations") or {}).get(c.ANN_NODE_USAGE)
        return c.parse_usage(raw) if raw else None

    # --- pods ---------------------------------------------------------------------------------------------------
    def create_pod(self, name: str, limits: dict[str, int], annotations: dict[str, str] | None = None,
                   labels: dict[str, str] | None = None) -> dict:
        """The pod in the apiserver, bound to the node (spec.nodeName set), one container "main"."""
        return self.api.add_pod(name=name, namespace=NAMESPACE, node_name=NODE, limits=limits,
                                annotations=annotations, labels=labels)

    def admit(self, pod: dict) -> AdmitResult:
        """The kubelet admits the pod (raises AdmissionError with the kubelet's message when it fails)."""
        return self.kubelet.admit(pod_spec(pod))

    def end_pod(self, pod: dict) -> None:
        """The pod's containers exit: the apiserver shows it Succeeded and the kubelet frees its devices."""
        self.api.set_pod_phase(NAMESPACE, pod["metadata"]["name"], "Succeeded")
        self.kubelet.remove_pod(pod["metadata"]["uid"])

    def delete_pod(self, pod: dict) -> None:
        self.kubelet.remove_pod(pod["metadata"]["uid"])
        self.api.delete_pod(NAMESPACE, pod["metadata"]["name"])

    def allocated(self, name: str) -> c.PodAssignment | None:
        """The daemon's record on the pod (gpushare.io/allocated), once written."""
        raw = (self.api.pod(NAMESPACE, name)["metadata"].get("annotations") or {}).get(c.ANN_ALLOCATED)
        return c.parse_assignment(raw, c.ANN_ALLOCATED) if raw else None

    def events(self, name: str, type_: str) -> list[dict]:
        return [e for e in self.api.events
                if (e.get("involvedObject") or {}).get("name") == name and e.get("type") == type_]

    def wait_event(self, name: str, type_: str, timeout: float = 5.0) -> dict | None:
        """The first Event of this type about pod `name` (the daemon writes them off the admission path)."""
        found = until(lambda: self.events(name, type_), timeout)
        return found[0] if found else None
